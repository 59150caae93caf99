"""The trainer's recipe parts in PyTorch, each written after the trainer's code so that a PyTorch run of
one of our configs trains what the trainer trains (bench/torch_fashion_mnist_recipe.py):
  build_model      resnet18/34/50 with the "cifar" stem (nn/models/resnet.cpp) and the small ViT
                   (nn/models/vit.cpp: torchvision's VisionTransformer layout) on C-channel images;
  param_groups     timm's no-weight-decay rule (nn/optim/optimizer.cpp, optim.no_decay_bn_bias);
  schedule_factor  nn/optim/lr_schedule.cpp's per-step factors, for a LambdaLR stepped after every update;
  WeightAverage    timm's ModelEmaV3 as nn/optim/ema.* and the CPU kernel apply it.
"""
import bisect
import copy
import math

import torch
import torchvision
from torchvision.models.vision_transformer import VisionTransformer

from torch_recipe_config import require

RESNETS = ("resnet18", "resnet34", "resnet50")
# The small ViT's sizes when the config leaves them at 0 (nn/models/registry.h's ModelOptions).
VIT_DEFAULTS = {"patch_size": 4, "depth": 6, "heads": 4, "width": 64, "mlp_dim": 256}


def build_model(m, channels, classes, image_size):
    """The [model] section's network for [N, channels, image_size, image_size] inputs."""
    in_channels = m["in_channels"] or channels
    num_classes = m["num_classes"] or classes
    require(m["name"] in RESNETS + ("vit",), "model.name", f"'{m['name']}' is not one of {RESNETS + ('vit',)}")
    if m["name"] == "vit":
        return small_vit(m, in_channels, num_classes, image_size)
    require(m["dropout"] == 0, "model.dropout", "the ResNets have no dropout (the trainer refuses it too)")
    require(m["width"] in (0, 64), "model.width", "torchvision's ResNets are 64 wide")
    stem = m["stem"] if m["stem"] != "auto" else ("cifar" if image_size <= 64 else "imagenet")
    model = getattr(torchvision.models, m["name"])(num_classes=num_classes)
    if stem == "cifar":  # 3x3 stride-1 convolution and no max-pool
        model.conv1 = torch.nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        model.maxpool = torch.nn.Identity()
    else:
        model.conv1 = torch.nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
    torch.nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model


def small_vit(m, in_channels, num_classes, image_size):
    size = {k: m[k] or v for k, v in VIT_DEFAULTS.items()}
    patch, width = size["patch_size"], size["width"]
    require(image_size % patch == 0, "model.patch_size", f"{patch} does not divide the image size {image_size}")
    model = VisionTransformer(image_size=image_size, patch_size=patch, num_layers=size["depth"],
                              num_heads=size["heads"], hidden_dim=width, mlp_dim=size["mlp_dim"],
                              dropout=m["dropout"], num_classes=num_classes)
    # torchvision's patch embedding takes 3 channels; ours takes the dataset's, initialised as torchvision does.
    model.conv_proj = torch.nn.Conv2d(in_channels, width, patch, patch)
    torch.nn.init.trunc_normal_(model.conv_proj.weight, std=math.sqrt(1.0 / (in_channels * patch * patch)))
    torch.nn.init.zeros_(model.conv_proj.bias)
    return model


def excluded_from_weight_decay(name, shape):
    """What is a vector in effect (norms, biases, the class token), and the position embedding."""
    dims_over_one = sum(1 for extent in shape if extent > 1)
    return dims_over_one <= 1 or name == "bias" or name.endswith(".bias") or name.endswith("pos_embedding")


def param_groups(model, weight_decay, no_decay_bn_bias):
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not no_decay_bn_bias:
        return [{"params": [p for _, p in named], "weight_decay": weight_decay}]
    skip = [p for n, p in named if excluded_from_weight_decay(n, p.shape)]
    decay = [p for n, p in named if not excluded_from_weight_decay(n, p.shape)]
    return [g for g in ({"params": decay, "weight_decay": weight_decay}, {"params": skip, "weight_decay": 0.0})
            if g["params"]]


def warmup_steps_of(s, steps_per_epoch, total_steps):
    """schedule.warmup_epochs in steps (std::llround), cut to half the schedule when not shorter."""
    warmup = int(math.floor(s["warmup_epochs"] * steps_per_epoch + 0.5))
    if total_steps > 0 and warmup >= total_steps:
        print(f"note: schedule.warmup_epochs = {s['warmup_epochs']} ({warmup} steps) is not shorter than the "
              f"{total_steps}-step schedule: warm-up cut to {total_steps // 2} steps, as the trainer does")
        warmup = total_steps // 2
    return warmup


def cos_anneal(start, end, pct):
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1.0)


def schedule_factor(s, steps_per_epoch, total_steps):
    """The LR factor of 0-based step `step` as a function (LambdaLR's lr_lambda), from [schedule]."""
    kind, warmup = s["name"], warmup_steps_of(s, steps_per_epoch, total_steps)
    start = s["warmup_start_factor"]
    kinds = ("constant", "step", "multistep", "cosine", "onecycle")
    require(kind in kinds, "schedule.name", f"'{kind}' is not one of {kinds}")
    if kind == "cosine":
        require(total_steps > warmup, "schedule.warmup_epochs", "leaves the cosine no step")
    if kind == "onecycle":
        # The trainer's OneCycleLR: div_factor 25, final_div_factor 1e4, rising over a quarter of the run
        # (or the warm-up); it does not read min_lr_factor.
        if s["min_lr_factor"] != 0:
            print("warning: schedule.min_lr_factor has no effect on the trainer's onecycle; ignored here too")
        rise_end = (warmup - 1.0) if warmup > 0 else 0.25 * total_steps - 1.0
        fall_end = total_steps - 1.0
        require(rise_end > 0 and fall_end > rise_end, "schedule", "onecycle needs more steps")

    def main(step):
        if kind == "step":
            return s["gamma"] ** (step // (s["step_epochs"] * steps_per_epoch))
        if kind == "multistep":
            return s["gamma"] ** bisect.bisect_right(s["milestones"], step // steps_per_epoch)
        if kind == "cosine":
            span = total_steps - warmup
            t = min(max(step - warmup, 0), span)
            return s["min_lr_factor"] + (1 - s["min_lr_factor"]) * (1 + math.cos(math.pi * t / span)) / 2
        if kind == "onecycle":
            initial = 1.0 / 25.0
            if step <= rise_end:
                return cos_anneal(initial, 1.0, step / rise_end)
            return cos_anneal(1.0, initial / 1e4, min(1.0, (step - rise_end) / (fall_end - rise_end)))
        return 1.0

    def factor(step):
        linear_warmup = kind != "onecycle" and step < warmup
        return (start + (1 - start) * step / warmup if linear_warmup else 1.0) * main(step)

    return factor


class WeightAverage:
    """timm's ModelEmaV3 over the whole state dict: after every every_steps-th optimizer step that was not
    skipped, average = lerp(average, value, 1 - decay); integer buffers (and, with average_buffers off,
    every buffer) copied. Update k (1-based) uses get_decay(k * every_steps): the first copies."""

    def __init__(self, model, e):
        self.e = e
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        buffers = {n for n, _ in model.named_buffers()}
        live, average = model.state_dict(), self.model.state_dict()
        self.averaged = [(average[k], v) for k, v in live.items()
                         if v.is_floating_point() and (e["average_buffers"] or k not in buffers)]
        self.copied = [(average[k], v) for k, v in live.items()
                       if not (v.is_floating_point() and (e["average_buffers"] or k not in buffers))]
        self.steps = self.updates = 0

    def decay(self, step):
        t = step - 1
        if t <= 0:
            return 0.0
        if not self.e["warmup"]:
            return self.e["decay"]
        d = 1.0 - (1.0 + t / self.e["warmup_gamma"]) ** -self.e["warmup_power"]
        return max(min(d, self.e["decay"]), self.e["min_decay"])

    @torch.no_grad()
    def after_optimizer_step(self, skipped):
        self.steps += 1
        if skipped or self.steps % self.e["every_steps"] != 0:
            return
        weight = 1.0 - self.decay((self.updates + 1) * self.e["every_steps"])
        averages, values = [a for a, _ in self.averaged], [v for _, v in self.averaged]
        if hasattr(torch, "_foreach_lerp_"):
            torch._foreach_lerp_(averages, values, weight)
        else:  # torch 1.13
            torch._foreach_mul_(averages, 1.0 - weight)
            torch._foreach_add_(averages, values, alpha=weight)
        for average, value in self.copied:
            average.copy_(value)
        self.updates += 1
