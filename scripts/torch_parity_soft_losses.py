"""Soft-target cross-entropy, binary cross-entropy with logits and Mixup/CutMix against PyTorch in
float64, with timm's formulas written out here (timm.data.mixup.mixup_target / Mixup._mix_batch,
timm.loss.SoftTargetCrossEntropy, BinaryCrossEntropy = F.binary_cross_entropy_with_logits on the
targets): the mixed images, the targets rebuilt from the labels and lambda, CutMix's lambda from its
clipped box, each loss and its gradient, to 1e-6 (absolute, on values of order 1).

    build/soft_losses_parity /tmp/soft && python3 scripts/torch_parity_soft_losses.py /tmp/soft
"""
import sys

import torch
import torch.nn.functional as F

from torch_parity import load_safetensors  # our reader: no safetensors package needed

TOLERANCE = 1e-6
SMOOTHING = 0.1


def load(path):
    tensors = load_safetensors(path)
    for name, t in tensors.items():
        assert t.dtype == torch.float64, f"{name}: expected F64, got {t.dtype}"
    return tensors


def one_hot(labels, num_classes, on_value, off_value):
    return torch.full((labels.size(0), num_classes), off_value, dtype=torch.float64).scatter_(
        1, labels.view(-1, 1), on_value)


def mixup_target(labels, num_classes, lam, smoothing):  # timm.data.mixup.mixup_target
    off_value = smoothing / num_classes
    on_value = 1.0 - smoothing + off_value
    y1 = one_hot(labels, num_classes, on_value, off_value)
    y2 = one_hot(labels.flip(0), num_classes, on_value, off_value)
    return y1 * lam + y2 * (1.0 - lam)


def mix_batch(x, cutmix, lam, box):  # timm.data.mixup.Mixup._mix_batch, mode "batch"
    x = x.clone()
    if lam == 1.0:
        return x
    if cutmix:
        yl, yh, xl, xh = box
        x[:, :, yl:yh, xl:xh] = x.flip(0)[:, :, yl:yh, xl:xh]
    else:
        x_flipped = x.flip(0).mul_(1.0 - lam)
        x.mul_(lam).add_(x_flipped)
    return x


def loss_of(kind, logits, target):
    if kind == "soft_ce":  # timm.loss.SoftTargetCrossEntropy
        return torch.sum(-target * F.log_softmax(logits, dim=-1), dim=-1).mean()
    return F.binary_cross_entropy_with_logits(logits, target, reduction="mean")


def main():
    ours = load(sys.argv[1] + "/soft.safetensors")
    worst = 0.0

    def check(what, got, expected):
        nonlocal worst
        error = (got - expected).abs().max().item()
        worst = max(worst, error)
        print(f"{what:28s} max abs error {error:.2e}")

    for case in sorted({k.split(".")[0] for k in ours}):
        draw = ours[f"{case}.draw"].tolist()
        cutmix, lam = draw[0] != 0.0, draw[1]
        box = [int(v) for v in draw[2:]]
        h, w = ours[f"{case}.images"].shape[-2:]
        if cutmix:  # timm's correct_lam: 1 - the clipped box's area / the image's
            check(f"{case} lambda", torch.tensor(lam), torch.tensor(1.0 - (box[1] - box[0]) * (box[3] - box[2]) / (h * w)))
        labels = ours[f"{case}.labels"].long()
        num_classes = ours[f"{case}.targets"].shape[1]
        target = mixup_target(labels, num_classes, lam, SMOOTHING)
        check(f"{case} targets", ours[f"{case}.targets"], target)
        check(f"{case} mixed images", ours[f"{case}.mixed"], mix_batch(ours[f"{case}.images"], cutmix, lam, box))
        for kind in ("soft_ce", "bce"):
            logits = ours[f"{case}.{kind}.logits"].clone().requires_grad_(True)
            loss = loss_of(kind, logits, target)
            loss.backward()
            check(f"{case} {kind} loss", ours[f"{case}.{kind}.loss"][0], loss.detach())
            check(f"{case} {kind} grad", ours[f"{case}.{kind}.grad_logits"], logits.grad)
    print(f"worst {worst:.2e} (tolerance {TOLERANCE:.0e})")
    sys.exit(0 if worst <= TOLERANCE else 1)


if __name__ == "__main__":
    main()
