#!/usr/bin/env python3
"""Replays build/parity_step's training step in PyTorch and compares: resnet18-cifar with SGD, or a
small ViT or ConvNeXt (torchvision's classes) with AdamW; init.safetensors' metadata names the model.

    build/parity_step /tmp/parity cpu f64 && python3 scripts/torch_parity.py /tmp/parity
    build/parity_step /tmp/parity cuda && python3 scripts/torch_parity.py /tmp/parity --device cuda
    build/parity_step /tmp/parity cpu f64 vit && python3 scripts/torch_parity.py /tmp/parity

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
loads the initial weights into torchvision's model, runs the same forward, cross-entropy, backward
and optimizer step (parity_step.cpp gives both optimizers' settings) with TF32 off, and reports the
relative error max|ours - torch| / max|torch| of the loss, the logits, every gradient and every
tensor after the step. Exits 1 when any exceeds the tolerance (1e-4 in float32, 1e-10 in float64).
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


def safetensors_metadata(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})


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


def make_model(name="resnet18"):
    """torchvision's classes with parity_step.cpp's sizes."""
    if name == "vit":
        return torchvision.models.VisionTransformer(image_size=32, patch_size=4, num_layers=2, num_heads=4,
                                                     hidden_dim=32, mlp_dim=64, num_classes=10)
    if name == "convnext":
        from torchvision.models.convnext import CNBlockConfig, ConvNeXt
        stages = [CNBlockConfig(16, 32, 1), CNBlockConfig(32, 48, 1), CNBlockConfig(48, 64, 2),
                  CNBlockConfig(64, None, 1)]
        model = ConvNeXt(stages, stochastic_depth_prob=0.0, layer_scale=0.5, num_classes=10)
        model.features[0][0] = nn.Conv2d(3, 16, kernel_size=2, stride=2)  # our small ConvNeXt's stem patch
        return model
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()
    return model


def make_optimizer(name, model):
    """parity_step.cpp's optimizers; AdamW without decay where optim.no_decay_bn_bias exempts it: tensors
    with at most one dimension above 1 (norms, biases, the class token, layer scales) and the position
    embedding."""
    if name == "resnet18":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        exempt = sum(s > 1 for s in p.shape) <= 1 or n.endswith("pos_embedding")
        (no_decay if exempt else decay).append(p)
    groups = [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=1e-3)


def nearest_kink(init, images, name="resnet18"):
    """The smallest |input| of any ReLU in a float64 forward pass, and the module it feeds (ReLU
    networks only: GELU has no kink)."""
    model = make_model(name)
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

    name = safetensors_metadata(f"{a.dir}/init.safetensors").get("model", "resnet18")
    init = load_safetensors(f"{a.dir}/init.safetensors")
    batch = load_safetensors(f"{a.dir}/batch.safetensors")
    ours = load_safetensors(f"{a.dir}/step.safetensors")

    model = make_model(name)
    model.load_state_dict(init, strict=True)  # our names are torchvision's: strict must pass
    dtype = ours["logits"].dtype
    if a.tolerance is None:
        a.tolerance = 1e-10 if dtype == torch.float64 else 1e-4
    margin, where = nearest_kink(init, batch["images"], name) if name == "resnet18" else (float("inf"), "-")
    model = model.to(a.device).to(dtype).train()
    opt = make_optimizer(name, model)
    logits = model(batch["images"].to(a.device).to(dtype))
    loss = nn.functional.cross_entropy(logits, batch["labels"].to(a.device))
    loss.backward()
    grads = {f"grad.{n}": p.grad.detach().clone() for n, p in model.named_parameters()}
    opt.step()

    rows = [("loss", rel_err(ours["loss"], loss.detach())), ("logits", rel_err(ours["logits"], logits.detach()))]
    rows += [(n, rel_err(ours[n], g)) for n, g in grads.items() if n in ours]
    missing = [n for n in grads if n not in ours]
    if missing and name != "resnet18":
        sys.exit(f"step.safetensors lacks {len(missing)} gradients, e.g. {missing[0]}")
    for name_, t in model.state_dict().items():
        mine = ours[f"after.{name_}"]
        if name_.endswith("in_proj_bias") and name != "resnet18":
            # The key part of an attention's input bias adds the same value to every score of a query
            # row, which softmax cancels: its gradient is exactly zero, so both sides hold rounding
            # noise there, which AdamW's g / (sqrt(v) + eps) scales up to a full step of either sign.
            # Those elements are checked as gradients (near zero on both sides), not after the step.
            d = t.shape[0] // 3
            g = grads[f"grad.{name_}"]
            rows.append((f"grad.{name_}[key part] / max|grad|",
                         max(ours[f"grad.{name_}"][d:2 * d].abs().max().item(), g[d:2 * d].abs().max().item())
                         / g.abs().max().item()))
            keep = torch.cat([torch.arange(0, d), torch.arange(2 * d, 3 * d)])
            mine, t = mine[keep], t.cpu()[keep]
        rows.append((f"after.{name_}", rel_err(mine, t)))
    worst = max(rows, key=lambda r: r[1])
    print(f"{name}: torch {torch.__version__} on {a.device} in {dtype}, TF32 off; "
          "relative error max|ours - torch| / max|torch|")
    for name, err in rows[:2] + sorted(rows[2:], key=lambda r: -r[1])[:8]:
        print(f"  {name:45s} {err:.2e}")
    print(f"  ({len(rows)} tensors compared; worst {worst[0]} {worst[1]:.2e}; tolerance {a.tolerance:.0e})")
    ok = worst[1] < a.tolerance
    if name == "resnet18":
        print(f"  nearest pre-activation to a ReLU kink: {margin:.2e} (in {where})")
    if not ok and dtype == torch.float32 and margin < 1e-5:
        print("  a float32 comparison through a ReLU this close to its kink is decided by rounding;"
              " rerun in float64 (parity_step OUT cpu f64) to tell a defect from it")
    print("PARITY OK" if ok else "PARITY FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
