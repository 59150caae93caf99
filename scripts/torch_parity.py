#!/usr/bin/env python3
"""Replays build/parity_step's SGD step of resnet18-cifar in PyTorch and compares.

    build/parity_step /tmp/parity cuda && python3 scripts/torch_parity.py /tmp/parity --device cuda

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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tolerance", type=float, default=1e-4)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True

    init = load_safetensors(f"{a.dir}/init.safetensors")
    batch = load_safetensors(f"{a.dir}/batch.safetensors")
    ours = load_safetensors(f"{a.dir}/step.safetensors")

    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()
    model.load_state_dict(init, strict=True)  # our names are torchvision's: strict must pass
    model = model.to(a.device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    logits = model(batch["images"].to(a.device))
    loss = nn.functional.cross_entropy(logits, batch["labels"].to(a.device))
    loss.backward()
    opt.step()

    rows = [("loss", rel_err(ours["loss"], loss.detach())), ("logits", rel_err(ours["logits"], logits.detach()))]
    for name, t in model.state_dict().items():
        rows.append((f"after.{name}", rel_err(ours[f"after.{name}"], t)))
    worst = max(rows, key=lambda r: r[1])
    print(f"torch {torch.__version__} on {a.device}, TF32 off; relative error max|ours - torch| / max|torch|")
    for name, err in rows[:2] + sorted(rows[2:], key=lambda r: -r[1])[:8]:
        print(f"  {name:45s} {err:.2e}")
    print(f"  ({len(rows)} tensors compared; worst {worst[0]} {worst[1]:.2e}; tolerance {a.tolerance:.0e})")
    ok = worst[1] < a.tolerance
    print("PARITY OK" if ok else "PARITY FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
