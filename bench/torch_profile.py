# Kernel-level profile of bench/torch_reference.py's training step (torch.profiler / CUPTI), to set
# next to `nn_bench --trace N` for the same model, batch and precision. Usage, on a GPU host:
#   python3 bench/torch_profile.py --model resnet18 --stem cifar --image 32 --batch 512 --dtype bf16 --channels-last
import argparse
import sys
import time

sys.path.insert(0, "bench")
import torch
from torch.profiler import ProfilerActivity, profile

import torch_reference as tr


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet18")
    p.add_argument("--stem", default="cifar")
    p.add_argument("--image", type=int, default=32)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--dtype", default="bf16", choices=["fp32", "tf32", "bf16", "fp16"])
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--sgd", default="foreach", choices=["foreach", "fused"])
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.dtype == "tf32"
    torch.backends.cudnn.allow_tf32 = a.dtype == "tf32"
    torch.backends.cudnn.benchmark = True
    step = tr.training_step(a.model, a.batch, a.image, 3, "cuda", a.dtype, a.channels_last, a.stem, a.sgd)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    ev = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    ev.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in ev)
    count = sum(e.count for e in ev)
    n = a.steps
    print(f"torch {a.model} b{a.batch} {a.dtype}: wall {wall * 1e3 / n:.3f} ms/step (profiled), "
          f"GPU kernels {total / 1e3 / n:.3f} ms/step, {count / n:.0f} kernels/step")
    for e in ev[: a.top]:
        print(f"  {e.self_device_time_total / 1e3 / n:8.3f} ms {e.count / n:6.1f}/step  {e.key[:140]}")


if __name__ == "__main__":
    main()
