#!/usr/bin/env python3
"""PyTorch reference for bench/nn_bench.cpp: forward + backward + SGD images/s of the same models on
the same inputs, so a trainer figure always comes with a PyTorch figure from the same machine.

    python3 bench/torch_reference.py                 # cnn 28x28x1 and resnet18-cifar 32x32x3, batch 64
    python3 bench/torch_reference.py --device cuda --batch 512 --model resnet18 --channels-last --dtype bf16
    ... --model vit_b_16 --image 224 --channels 3 --classes 1000 --optim adamw --sgd fused   (also
                                    vit_s_16, convnext_tiny: torchvision's, as the trainer builds them)
    ... --device cuda --compile     torch.compile(model, mode="reduce-overhead") + fused SGD; peak memory is
                                    torch.cuda.max_memory_reserved() since process start (compiling and the
                                    CUDA graphs' pools included). GPU only: on the CPU it prints a skip line.
"""
import argparse
import contextlib
import os
import time

import torch
import torch.nn as nn
import torchvision


class Cnn(nn.Module):
    """The trainer's `cnn` model (nn/models/cnn.cpp): same layers, same state_dict keys."""

    def __init__(self, c=1, size=28, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(c, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(64 * (size // 4) ** 2, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = self.pool(torch.relu(self.bn2(self.conv2(x))))
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))


def resnet(name, channels, classes, stem):
    model = getattr(torchvision.models, name)(num_classes=classes)
    if stem == "cifar":  # 3x3 stride-1 first conv, no max-pool: the trainer's "cifar" stem
        model.conv1 = nn.Conv2d(channels, 64, 3, 1, 1, bias=False)
        model.maxpool = nn.Identity()
    elif channels != 3:
        model.conv1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
    return model


def vision_model(name, image, classes):
    """torchvision's ViT and ConvNeXt as the trainer builds them (nn/models/vit.cpp, convnext.cpp);
    vit_s_16 is torchvision's VisionTransformer class with DeiT-S's sizes, as in the trainer."""
    if name == "vit_s_16":
        return torchvision.models.VisionTransformer(image, 16, 12, 6, 384, 1536, num_classes=classes)
    if name.startswith("vit_"):
        return getattr(torchvision.models, name)(image_size=image, num_classes=classes)
    return getattr(torchvision.models, name)(num_classes=classes)


def build_model(name, image, channels, classes, stem):
    if name == "cnn":
        return Cnn(channels, image, classes)
    if name.startswith(("vit_", "convnext_")):
        return vision_model(name, image, classes)
    return resnet(name, channels, classes, stem)


def make_optimizer(model, optim, fused, device):
    # `fused` is passed only when wanted: PyTorch 1.13 (Debian's, the CPU reference) has no such argument.
    kind = {"fused": True} if fused and device == "cuda" else {"foreach": True}
    if optim == "adamw":  # the trainer's bench: lr 1e-3, weight decay 0.05 (none on 1-D tensors)
        decay = [p for p in model.parameters() if p.dim() > 1]
        no_decay = [p for p in model.parameters() if p.dim() <= 1]
        groups = [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=1e-3, **kind)
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, **kind)


def training_step(model_name, batch, image, channels, device, dtype, channels_last, stem, sgd="foreach",
                  compile=False, optim="sgd", classes=10):
    """One training step on fixed random inputs, as a closure: autocast forward for bf16/fp16, scaled
    backward and GradScaler for fp16, SGD with momentum or AdamW (bench/torch_profile.py profiles the
    same). sgd: "foreach" (PyTorch's default on CUDA: a few multi-tensor launches) or "fused" (one
    kernel), for AdamW too."""
    torch.manual_seed(1)
    model = build_model(model_name, image, channels, classes, stem)
    model = model.to(device)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    if compile:  # CUDA graphs of the compiled forward and backward; the optimizer step stays eager
        model = torch.compile(model, mode="reduce-overhead")
    opt = make_optimizer(model, optim, sgd == "fused", device)
    x = torch.randn(batch, channels, image, image, device=device).to(memory_format=fmt)
    y = torch.randint(0, classes, (batch,), device=device)
    amp = dtype in ("bf16", "fp16")
    amp_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    scaler = torch.cuda.amp.GradScaler(enabled=dtype == "fp16")

    def step():
        with torch.autocast(device_type=device, dtype=amp_dtype) if amp else contextlib.nullcontext():
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    return step


def run(model_name, batch, image, channels, iters, device, dtype, channels_last, stem, sgd, compile=False,
        optim="sgd", classes=10):
    step = training_step(model_name, batch, image, channels, device, dtype, channels_last, stem, sgd, compile,
                         optim, classes)
    for _ in range(10 if compile else 3):  # compiling, then reduce-overhead's warm-up and graph recording
        step()
    if device == "cuda":
        torch.cuda.synchronize()
        if not compile:  # a compiled run reports its peak since process start, compilation included
            torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    ips = batch * iters / (time.perf_counter() - t0)
    if device != "cuda":
        peak = 0.0
    elif compile:
        peak = torch.cuda.max_memory_reserved() / 2**20
    else:
        peak = torch.cuda.max_memory_allocated() / 2**20
    return ips, peak


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--image", type=int, default=28)
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"])
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--stem", default="cifar")
    # On by default: with static shapes an experienced user turns cuDNN's autotuner on, and the trainer
    # times its convolution algorithms too, so PyTorch's best eager figure needs it.
    p.add_argument("--cudnn-benchmark", type=int, default=1, help="torch.backends.cudnn.benchmark (default 1)")
    p.add_argument("--sgd", default="foreach", choices=["foreach", "fused"])
    p.add_argument("--optim", default="sgd", choices=["sgd", "adamw"],
                   help="SGD with momentum 0.9, or AdamW as nn_bench --optim adamw")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--compile", action="store_true",
                   help='GPU only: torch.compile(model, mode="reduce-overhead") with fused SGD')
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads (default: all cores)")
    a = p.parse_args()
    if a.compile and a.device != "cuda":
        print("torch_reference: --compile is timed on a GPU only; skipped on", a.device)
        return
    if a.compile:
        a.sgd = "fused"
    torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = a.dtype == "tf32"
    torch.backends.cudnn.allow_tf32 = a.dtype == "tf32"
    torch.backends.cudnn.benchmark = bool(a.cudnn_benchmark)
    points = [(a.model, a.batch, a.image, a.channels, a.iters)] if a.model else [
        ("cnn", 64, 28, 1, 30), ("resnet18", 64, 32, 3, 3)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {a.device}")
    print(f"{'model':10} {'batch':>6} {'input':>12} {'impl':>10} {'dtype':>5} {'layout':>6} {'img/s':>10} {'peak MiB':>9}")
    for m, b, s, c, n in points:
        ips, peak = run(m, b, s, c, n, a.device, a.dtype, a.channels_last, a.stem, a.sgd, a.compile, a.optim,
                        a.classes)
        layout = "cl" if a.channels_last else "nchw"
        impl = "compile-fused" if a.compile else f"torch-{a.sgd}" + ("" if a.cudnn_benchmark else "-nobench")
        print(f"{m:10} {b:6d} {s:5d}x{s}x{c} {impl:>10} {a.dtype:>5} {layout:>6} {ips:10.1f} {peak:9.0f}")


if __name__ == "__main__":
    main()
