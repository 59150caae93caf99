#!/usr/bin/env python3
"""`trainer eval` of torchvision's own vit_b_16 and convnext_tiny against PyTorch in float64.

    python3 scripts/torchvision_eval_check.py --trainer build/trainer [--device cpu|cuda] [--models ...]

For each model, torchvision builds it with a fixed seed (make_vit_torchvision_golden.py's and
torchvision_convnext_reference.py's: no zero head, layer scales that count) with a 10-class head, and
the state dict is saved as safetensors with our writer. `trainer eval` evaluates that file on a small
synthetic test split (train.precision fp32: TF32 off on a GPU) and writes its loss (--summary) and the
normalized images, labels and logits (--dump-logits). PyTorch runs the same images through the same
weights in float64. The mean cross-entropy must agree within --tolerance (1e-5, relative); the logits'
largest difference is printed beside it. Exits 1 otherwise. Run by ctest (torchvision_eval_loss) on the
CPU; by hand with --device cuda on a GPU host.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn

from make_torch_golden import save_safetensors  # our writer: no safetensors package needed
from make_vit_torchvision_golden import seeded_vit_b_16
from torch_parity import load_safetensors  # our reader
from torchvision_convnext_reference import seeded_convnext_tiny

# (image size, test images): vit_b_16 takes torchvision's 224; ConvNeXt any multiple of 32.
MODELS = {"vit_b_16": (224, 8), "convnext_tiny": (64, 16)}

CONFIG = """[model]
name = "{model}"
[data]
dataset = "synthetic"
synthetic_samples = {samples}
synthetic_image_size = {size}
synthetic_classes = 10
batch_size = 8
eval_batch_size = 8
[train]
device = "{device}"
precision = "fp32"
"""


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def torchvision_model(name):
    return seeded_vit_b_16(num_classes=10) if name == "vit_b_16" else seeded_convnext_tiny(num_classes=10)[0]


def check(trainer, name, workdir, device, tolerance):
    size, images = MODELS[name]
    model = torchvision_model(name)
    weights = os.path.join(workdir, f"{name}.safetensors")
    save_safetensors(weights, {k: v.float() for k, v in model.state_dict().items()})
    cfg = os.path.join(workdir, f"{name}.toml")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(model=name, samples=5 * images, size=size, device=device))
    summary, dump = os.path.join(workdir, f"{name}.json"), os.path.join(workdir, f"{name}_logits.safetensors")
    run([trainer, "eval", cfg, "--weights", weights, "--summary", summary, "--dump-logits", dump])
    with open(summary) as f:
        ours_loss = json.load(f)["loss"]
    ours = load_safetensors(dump)
    with torch.no_grad():
        logits = model.double().eval()(ours["images"].double())
        loss = nn.functional.cross_entropy(logits, ours["labels"]).item()
    rel = abs(ours_loss - loss) / abs(loss)
    diff = (ours["logits"].double() - logits).abs().max().item()
    ok = rel <= tolerance and ours["images"].shape[0] == images
    print(f"{name:14s} {size}x{size} on {device}: {ours['images'].shape[0]} images, loss ours {ours_loss:.9f} "
          f"torch(f64) {loss:.9f}, relative {rel:.2e} (tolerance {tolerance:.0e}); max |logit diff| {diff:.2e} "
          f"-> {'OK' if ok else 'FAIL'}", flush=True)
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trainer", default="build/trainer")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tolerance", type=float, default=1e-5)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    a = p.parse_args()
    print(f"torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        results = [check(a.trainer, m, workdir, a.device, a.tolerance) for m in a.models]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
