#!/usr/bin/env python3
"""PyTorch DistributedDataParallel reference for `trainer bench` (issue 13): the same workloads at the same
per-GPU batch, measured the same way (warm-up steps dropped, global img/s), so that every multi-GPU
trainer row has a PyTorch row from the same host and run. Launched by torchrun, one process per GPU:

    torchrun --standalone --nproc-per-node 2 bench/torch_ddp_bench.py             # the three points below
    torchrun --standalone --nproc-per-node 2 bench/torch_ddp_bench.py --sync-bn
    torchrun --standalone --nproc-per-node 1 bench/torch_ddp_bench.py --model resnet50 --batch 128
    python3 -m torch.distributed.run --nproc-per-node 2 bench/torch_ddp_bench.py --device cpu \\
        --model resnet18 --image 8 --batch 4 --steps 2 --warmup 1                  # a CPU smoke test (gloo)

Default points (as `trainer bench` runs them): resnet18 with the CIFAR stem on 32x32x3, 10 classes, per-GPU
batch 128 and 512; resnet50 with the ImageNet stem on 224x224x3, 1000 classes, per-GPU batch 128. Each step:
bf16 autocast forward (--dtype), channels-last (--no-channels-last: NCHW), cross-entropy, backward (DDP
all-reduces gradient buckets during it), SGD momentum 0.9 with lr = --lr x global batch / --base-batch
(linear scaling, as optim.lr_scaling = "linear"). Inputs are random images and labels made on the GPU
once (a few batches, cycled), so no input pipeline is measured. The models come from
bench/torch_reference.py, the single-GPU reference.

At world size 1 the model is not wrapped in DDP unless --ddp-at-world-1 (the trainer has no reducer at
world size 1 either; DDP's wrapper costs a third at batch 512 on an H200, see DESIGN.md).

Rank 0 prints one row per point, with the columns of `trainer bench`'s table where they mean the same:
procs, batch/rank, global, precision, lr, img/s (global: world x batch x steps / wall time of the timed
steps, between two cuda synchronizes + barriers), img/s per GPU, and the peak memory allocated by
PyTorch on any rank (MiB).
"""
import argparse
import contextlib
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import resnet  # noqa: E402  (the model builders, shared with the 1-GPU reference)

# (model, stem, image size, classes, per-GPU batch): `trainer bench` configs/cifar10_resnet18.toml at
# --batch 128,512 and configs/imagefolder_resnet50.toml at --batch 128 (synthetic data).
DEFAULT_POINTS = [("resnet18", "cifar", 32, 10, 128), ("resnet18", "cifar", 32, 10, 512),
                  ("resnet50", "imagenet", 224, 1000, 128)]

HEADER = (f"{'':8} {'model':18} {'procs':>5} {'batch/rank':>10} {'global':>7} {'precision':>9} {'syncbn':>6} "
          f"{'ddp':>4} {'lr':>9} {'img/s':>10} {'img/s/GPU':>10} {'peak MiB':>9}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["resnet18", "resnet34", "resnet50"],
                   help="one model instead of the default points")
    p.add_argument("--stem", choices=["cifar", "imagenet"],
                   help="default: cifar below 64 pixels, else imagenet (resnet50 without --image: imagenet)")
    p.add_argument("--image", type=int, help="image side (default: 32 for the cifar stem, 224 otherwise)")
    p.add_argument("--classes", type=int, help="default: 10 for the cifar stem, 1000 otherwise")
    p.add_argument("--batch", default=None, help="per-GPU batch sizes, e.g. 128,512 (with --model)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per point")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (cuDNN autotuning, DDP buckets)")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--no-channels-last", dest="channels_last", action="store_false")
    p.add_argument("--sync-bn", action="store_true", help="nn.SyncBatchNorm.convert_sync_batchnorm")
    p.add_argument("--ddp-at-world-1", action="store_true", help="wrap in DDP at world size 1 too")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate at --base-batch images per step")
    p.add_argument("--base-batch", type=int, default=128)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: gloo, for a smoke test")
    p.add_argument("--sgd", default="foreach", choices=["foreach", "fused"],
                   help="PyTorch's SGD implementation (bench/torch_reference.py takes the same)")
    p.add_argument("--no-header", action="store_true")
    a = p.parse_args(argv)
    if a.sync_bn and a.device == "cpu":
        p.error("--sync-bn needs --device cuda (PyTorch's SyncBatchNorm runs on GPUs only)")
    if a.model:
        a.stem = a.stem or ("cifar" if (a.image or (224 if a.model == "resnet50" else 32)) < 64 else "imagenet")
        a.image = a.image or (32 if a.stem == "cifar" else 224)
        a.classes = a.classes or (10 if a.stem == "cifar" else 1000)
        batches = [int(b) for b in (a.batch or "128").split(",")]
        a.points = [(a.model, a.stem, a.image, a.classes, b) for b in batches]
    else:
        if a.batch or a.image or a.stem or a.classes:
            p.error("--batch, --image, --stem and --classes need --model")
        a.points = DEFAULT_POINTS
    return a


def max_over_ranks(value, device):
    t = torch.tensor([float(value)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_point(a, point, device, world, rank):
    model_name, stem, image, classes, batch = point
    torch.manual_seed(1)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = resnet(model_name, 3, classes, stem)
    if a.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device).to(memory_format=fmt)
    wrapped = world > 1 or a.ddp_at_world_1
    if wrapped:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    global_batch = batch * world
    lr = a.lr * global_batch / a.base_batch
    fused = a.sgd == "fused" and device.type == "cuda"
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, fused=fused or None, foreach=None if fused else True)

    # A few distinct batches per rank, made on the device once and cycled.
    gen = torch.Generator(device=device).manual_seed(1000 + rank)
    pool = [(torch.randn(batch, 3, image, image, device=device, generator=gen).to(memory_format=fmt),
             torch.randint(0, classes, (batch,), device=device, generator=gen)) for _ in range(4)]
    amp = a.dtype == "bf16"

    def step(i):
        x, y = pool[i % len(pool)]
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16) if amp else contextlib.nullcontext():
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(a.warmup):
        step(i)
    sync(device)
    t0 = time.perf_counter()
    for i in range(a.steps):
        step(a.warmup + i)
    sync(device)
    elapsed = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    peak = max_over_ranks(peak, device)
    elapsed = max_over_ranks(elapsed, device)
    ips = global_batch * a.steps / elapsed
    if rank == 0:
        name = f"{model_name}-{stem}{image}"
        print(f"{'torchddp':8} {name:18} {world:5d} {batch:10d} {global_batch:7d} {a.dtype:>9} "
              f"{'on' if a.sync_bn else 'off':>6} {'yes' if wrapped else 'no':>4} {lr:9.4g} {ips:10.1f} "
              f"{ips / world:10.1f} {peak:9.0f}", flush=True)
    del model, opt, pool


def main(argv=None):
    a = parse_args(argv)
    if "RANK" not in os.environ:  # plain python3: a world of one, for quick checks
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29511"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if a.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
        torch.backends.cudnn.benchmark = True
    else:
        device = torch.device("cpu")
        backend = "gloo"
    torch.backends.cuda.matmul.allow_tf32 = a.dtype == "tf32"
    torch.backends.cudnn.allow_tf32 = a.dtype == "tf32"
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=5))
    world, rank = dist.get_world_size(), dist.get_rank()
    if rank == 0:
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else "-"
        print(f"# torch {torch.__version__}, DDP over {backend} (NCCL {nccl}), world {world}, {gpu}, "
              f"{a.steps} timed steps after {a.warmup} warm-up, {'channels-last' if a.channels_last else 'NCHW'}",
              flush=True)
        if not a.no_header:
            print(HEADER, flush=True)
    try:
        for point in a.points:
            bench_point(a, point, device, world, rank)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
