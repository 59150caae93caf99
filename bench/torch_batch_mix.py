"""Mixup and CutMix per batch for the PyTorch recipe scripts, with timm's Mixup semantics (mode "batch")
as the trainer's nn/batch_mix.* has them: with probability `prob` the batch is mixed with itself in
reverse order (sample i with sample N - 1 - i), by CutMix with probability `switch_prob` when both
alphas are set, lambda ~ Beta(alpha, alpha); CutMix's box has sides int(side * sqrt(1 - lambda)), a
uniform centre, is clipped to the image, and lambda becomes 1 - the clipped box's share. Targets are the
label-smoothed one-hots mixed by lambda. torchvision.transforms.v2.MixUp/CutMix exist only in newer
torchvision, so the draws are written here (numpy, in timm's order of calls).
"""
import numpy as np
import torch


class BatchMix:
    def __init__(self, mixup_alpha, cutmix_alpha, prob, switch_prob, seed):
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.prob, self.switch_prob = prob, switch_prob
        self.rng = np.random.default_rng(seed)

    @property
    def enabled(self):
        return self.prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)

    def draw(self, height, width):
        """(cutmix, lambda, box) for one batch; lambda 1 leaves it alone. box = (y0, y1, x0, x1)."""
        if not self.enabled or not self.rng.random() < self.prob:
            return False, 1.0, None
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            cutmix = bool(self.rng.random() < self.switch_prob)
            lam = float(self.rng.beta(*(2 * [self.cutmix_alpha if cutmix else self.mixup_alpha])))
        elif self.mixup_alpha > 0:
            cutmix, lam = False, float(self.rng.beta(self.mixup_alpha, self.mixup_alpha))
        else:
            cutmix, lam = True, float(self.rng.beta(self.cutmix_alpha, self.cutmix_alpha))
        if lam == 1.0 or not cutmix:
            return False, lam, None
        ratio = np.sqrt(1.0 - lam)
        cut_h, cut_w = int(height * ratio), int(width * ratio)
        cy, cx = int(self.rng.integers(0, height)), int(self.rng.integers(0, width))
        y0, y1 = np.clip([cy - cut_h // 2, cy + cut_h // 2], 0, height)
        x0, x1 = np.clip([cx - cut_w // 2, cx + cut_w // 2], 0, width)
        lam = 1.0 - float((y1 - y0) * (x1 - x0)) / float(height * width)
        return True, lam, (int(y0), int(y1), int(x0), int(x1))

    def __call__(self, x, labels, num_classes, smoothing):
        """x [N, C, H, W] normalised (mixed in place) and labels [N] -> (x, soft targets [N, K])."""
        cutmix, lam, box = self.draw(x.shape[-2], x.shape[-1])
        targets = smoothed_one_hot(labels, num_classes, smoothing)
        if lam == 1.0:
            return x, targets
        if cutmix:
            y0, y1, x0, x1 = box
            x[:, :, y0:y1, x0:x1] = x.flip(0)[:, :, y0:y1, x0:x1]
        else:
            x = x * lam + x.flip(0) * (1.0 - lam)
        return x, targets * lam + targets.flip(0) * (1.0 - lam)


def smoothed_one_hot(labels, num_classes, smoothing):
    """[N] -> [N, K]: smoothing / K on every class and 1 - smoothing + smoothing / K on the label."""
    off = smoothing / num_classes
    targets = torch.full((labels.shape[0], num_classes), off, device=labels.device)
    return targets.scatter_(1, labels[:, None], 1.0 - smoothing + off)
