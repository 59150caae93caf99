#!/usr/bin/env python3
"""Checks that our resnet18 weights are torchvision's: same names, same layout, same logits.

    python3 scripts/torchvision_logits_check.py --trainer build/trainer [--device cpu|cuda]

For each stem (cifar: 3x3/1 conv, no max-pool, 32x32 images; imagenet: torchvision's own stem, 64x64
images) it trains resnet18 for a few steps on synthetic 3-channel data with `trainer train` (so the
weights and BatchNorm running statistics are not at their initial values), then runs
`trainer eval --dump-logits`, which writes the test images exactly as the model saw them (normalized
NCHW), their labels and our logits. The weights are loaded with load_state_dict(strict=True) into
torchvision.models.resnet18, which runs the same images in eval mode; the largest absolute logit
difference must be at most --tolerance (1e-4). Exits 1 otherwise.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torchvision

from torch_parity import load_safetensors  # our reader: no safetensors package needed

CONFIG = """[model]
name = "resnet18"
stem = "{stem}"
[data]
dataset = "synthetic"
synthetic_samples = 640
synthetic_image_size = {size}
batch_size = 16
eval_batch_size = 32
[train]
epochs = 1
max_steps = 3
[optim]
lr = 0.05
[checkpoint]
every_epochs = 0
"""


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def torchvision_resnet18(stem, num_classes):
    model = torchvision.models.resnet18(num_classes=num_classes)
    if stem == "cifar":  # the usual CIFAR variant, as ours: conv1 becomes 3x3/1, no max-pool
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    return model


def check(trainer, stem, size, workdir, device, tolerance):
    cfg = os.path.join(workdir, f"{stem}.toml")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(stem=stem, size=size))
    run_dir = os.path.join(workdir, f"run-{stem}")
    run([trainer, "train", cfg, "--set", f"train.run_dir={run_dir}"])
    weights = os.path.join(run_dir, "checkpoints", "final.safetensors")
    dump = os.path.join(workdir, f"logits-{stem}.safetensors")
    run([trainer, "eval", cfg, "--weights", weights, "--dump-logits", dump])

    ours = load_safetensors(dump)
    state = load_safetensors(weights)
    model = torchvision_resnet18(stem, ours["logits"].shape[1])
    model.load_state_dict(state, strict=True)  # every name and shape must match torchvision's
    model.eval().to(device)
    with torch.no_grad():
        theirs = model(ours["images"].to(device)).double().cpu()
    diff = (ours["logits"].double() - theirs).abs().max().item()
    scale = theirs.abs().max().item()
    agree = (ours["logits"].argmax(1) == theirs.argmax(1)).float().mean().item()
    ok = diff <= tolerance
    print(f"resnet18 {stem:8s} {size}x{size}: {len(state)} tensors loaded strictly, "
          f"{ours['images'].shape[0]} images, max |ours - torchvision| = {diff:.3e} "
          f"(logits up to {scale:.3f}), argmax agreement {100 * agree:.1f}% -> {'OK' if ok else 'FAIL'}",
          flush=True)
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trainer", default="build/trainer")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tolerance", type=float, default=1e-4)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, device {a.device}", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        results = [check(a.trainer, stem, size, workdir, a.device, a.tolerance)
                   for stem, size in (("cifar", 32), ("imagenet", 64))]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
