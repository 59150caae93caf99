#!/usr/bin/env python3
"""Replays build/parity_step's SGD step of resnet18-cifar in PyTorch and compares.

    build/parity_step /tmp/parity cpu f64 && python3 scripts/torch_parity.py /tmp/parity
    build/parity_step /tmp/parity cuda && python3 scripts/torch_parity.py /tmp/parity --device cuda

The precision follows the files (parity_step's f32 or f64). Why the CPU check is best run in f64:
a ReLU network's gradient jumps where a pre-activation crosses zero, and resnet18-cifar at batch 8 has
2.9 million pre-activations, the nearest within ~3e-7 of zero. Float32 rounding moves values by
~1e-6 after a few layers, so which side such an element lands on (and a gradient error of up to the
whole upstream value there, ~1e-2 relative) depends on the BLAS kernels' summation order, not on
correctness: OpenBLAS's Prescott kernels happen to land on PyTorch's side, its Haswell, SkylakeX
and Cooperlake kernels do not. In float64 rounding moves values by ~1e-15 and the check is exact.
The script prints the nearest pre-activation (from a float64 replay) so a float32 failure can be
told from a defect; tests/nn/torch_golden_test.cpp is the float32 check on inputs kept away from
every kink.

Reads the trainer's safetensors files with a reader written here (no safetensors package needed),
loads the initial weights into torchvision's resnet18 with the CIFAR stem, runs the same forward,
cross-entropy, backward and SGD step (lr 0.1, momentum 0.9, weight decay 5e-4) with TF32 off, and
reports the relative error max|ours - torch| / max|torch| of the loss, the logits and every tensor
after the step. Exits 1 when any exceeds the tolerance (1e-4).
"""
import argparse
import json
import struct
import sys

import torch
import torch.nn as nn
import torchvision

DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "U8": torch.uint8}


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(body[begin:end]), dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out


def rel_err(ours, ref):
    ours, ref = ours.double().cpu(), ref.double().cpu()
    scale = ref.abs().max().item()
    return (ours - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def make_model():
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()
    return model


def nearest_kink(init, images):
    """The smallest |input| of any ReLU in a float64 forward pass, and the module it feeds."""
    model = make_model()
    model.load_state_dict(init, strict=True)
    model = model.double().train()
    nearest = [float("inf"), ""]

    def record(name):
        def hook(module, inputs):
            m = inputs[0].abs().min().item()
            if m < nearest[0]:
                nearest[:] = [m, name]
        return hook
    for name, module in model.named_modules():
        if isinstance(module, nn.ReLU):
            module.register_forward_pre_hook(record(name or "relu"))
    with torch.no_grad():
        model(images.double())
    return nearest[0], nearest[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tolerance", type=float, default=None,
                   help="default 1e-4 in float32, 1e-10 in float64")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True

    init = load_safetensors(f"{a.dir}/init.safetensors")
    batch = load_safetensors(f"{a.dir}/batch.safetensors")
    ours = load_safetensors(f"{a.dir}/step.safetensors")

    model = make_model()
    model.load_state_dict(init, strict=True)  # our names are torchvision's: strict must pass
    dtype = ours["logits"].dtype
    if a.tolerance is None:
        a.tolerance = 1e-10 if dtype == torch.float64 else 1e-4
    margin, where = nearest_kink(init, batch["images"])
    model = model.to(a.device).to(dtype).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    logits = model(batch["images"].to(a.device).to(dtype))
    loss = nn.functional.cross_entropy(logits, batch["labels"].to(a.device))
    loss.backward()
    opt.step()

    rows = [("loss", rel_err(ours["loss"], loss.detach())), ("logits", rel_err(ours["logits"], logits.detach()))]
    for name, t in model.state_dict().items():
        rows.append((f"after.{name}", rel_err(ours[f"after.{name}"], t)))
    worst = max(rows, key=lambda r: r[1])
    print(f"torch {torch.__version__} on {a.device} in {dtype}, TF32 off; relative error max|ours - torch| / max|torch|")
    for name, err in rows[:2] + sorted(rows[2:], key=lambda r: -r[1])[:8]:
        print(f"  {name:45s} {err:.2e}")
    print(f"  ({len(rows)} tensors compared; worst {worst[0]} {worst[1]:.2e}; tolerance {a.tolerance:.0e})")
    ok = worst[1] < a.tolerance
    print(f"  nearest pre-activation to a ReLU kink: {margin:.2e} (in {where})")
    if not ok and dtype == torch.float32 and margin < 1e-5:
        print("  a float32 comparison through a ReLU this close to its kink is decided by rounding;"
              " rerun in float64 (parity_step OUT cpu f64) to tell a defect from it")
    print("PARITY OK" if ok else "PARITY FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
