#!/usr/bin/env python3
"""PyTorch's figure for issue 24: ResNet-50 trained on a JPEG folder with torchvision's ImageFolder and
DataLoader (all cores as workers, pinned memory, persistent workers), bf16 autocast, channels-last,
SGD: steady-state img/s and the share of each step spent waiting for data.

    python3 bench/torch_imagefolder_bench.py /tmp/jpegs --batch 128 --steps 60 --warmup 10
"""
import argparse
import os
import time

import torch
import torchvision
import torchvision.transforms as T


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    data = torchvision.datasets.ImageFolder(os.path.join(a.root, "train"), transform)
    loader = torch.utils.data.DataLoader(data, batch_size=a.batch, shuffle=True, drop_last=True,
                                         num_workers=a.workers, pin_memory=True, persistent_workers=True)
    model = torchvision.models.resnet50(num_classes=len(data.classes)).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    step, waited, timed = 0, 0.0, 0.0
    while step < a.warmup + a.steps:
        it = iter(loader)
        while step < a.warmup + a.steps:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            x = x.cuda(non_blocking=True).to(memory_format=torch.channels_last)
            y = y.cuda(non_blocking=True)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if step >= a.warmup:
                waited += t1 - t0
                timed += t2 - t0
            step += 1
    print(f"pytorch imagefolder resnet50 bf16 batch {a.batch} workers {a.workers}: "
          f"{a.steps * a.batch / timed:.0f} img/s, data_wait {100 * waited / timed:.1f}%")


if __name__ == "__main__":
    main()
