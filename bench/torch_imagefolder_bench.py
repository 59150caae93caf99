#!/usr/bin/env python3
"""PyTorch's figure for issue 24: ResNet-50 trained on a JPEG folder with torchvision's ImageFolder and
DataLoader (all cores as workers, pinned memory, persistent workers), bf16 autocast, channels-last,
SGD: steady-state img/s and the share of each step spent waiting for data. With --cifar, resnet18-cifar
on a CIFAR-10 set in the binary version's format (the trainer's `data.dataset = "cifar10"`), read into
memory as torchvision's CIFAR10 does, with its usual RandomCrop(32, 4) + flip. With --augment, issue 39's
heavy recipe on top of the crop and flip: RandAugment(2, 9) and RandomErasing(0.25) per image in the
workers, Mixup 0.8 / CutMix 1.0 per batch on the device (bench/torch_batch_mix.py) with soft targets.

    python3 bench/torch_imagefolder_bench.py /tmp/jpegs --batch 128 --steps 60 --warmup 10
    python3 bench/torch_imagefolder_bench.py /tmp/jpegs --batch 256 --augment
    python3 bench/torch_imagefolder_bench.py /tmp/cifar-10-batches-bin --cifar --batch 512
"""
import argparse
import os
import time

import numpy as np
import torch
import torchvision
import torchvision.transforms as T
from PIL import Image

from torch_batch_mix import BatchMix


class CifarBinary(torch.utils.data.Dataset):
    """CIFAR-10's binary version in memory, images as PIL like torchvision.datasets.CIFAR10 gives them."""

    def __init__(self, root, transform):
        records = np.concatenate([np.fromfile(os.path.join(root, f"data_batch_{i}.bin"), dtype=np.uint8)
                                  for i in range(1, 6)]).reshape(-1, 3073)
        self.labels = records[:, 0].astype(np.int64)
        self.images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy()
        self.transform = transform
        self.classes = list(range(10))

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(Image.fromarray(self.images[i])), int(self.labels[i])


def cifar_resnet18():
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = torch.nn.Identity()
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--cifar", action="store_true", help="resnet18-cifar on a CIFAR-10 binary set")
    p.add_argument("--augment", action="store_true",
                   help="RandAugment(2, 9) + RandomErasing(0.25) + Mixup 0.8 / CutMix 1.0 (issue 39)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu to check the script (fp32 there)")
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True
    if a.cifar:
        crop, mean, std = [T.RandomCrop(32, padding=4)], [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]
    else:
        crop, mean, std = [T.RandomResizedCrop(224)], [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    policy = [T.RandAugment(2, 9)] if a.augment else []
    erasing = [T.RandomErasing(0.25)] if a.augment else []
    transform = T.Compose(crop + [T.RandomHorizontalFlip()] + policy + [T.ToTensor(), T.Normalize(mean, std)] +
                          erasing)
    if a.cifar:
        data = CifarBinary(a.root, transform)
    else:
        data = torchvision.datasets.ImageFolder(os.path.join(a.root, "train"), transform)
    cuda = a.device == "cuda"
    loader = torch.utils.data.DataLoader(data, batch_size=a.batch, shuffle=True, drop_last=True,
                                         num_workers=a.workers, pin_memory=cuda, persistent_workers=True)
    classes = len(data.classes)
    model = cifar_resnet18() if a.cifar else torchvision.models.resnet50(num_classes=classes)
    model = model.to(a.device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    mix = BatchMix(0.8 if a.augment else 0.0, 1.0 if a.augment else 0.0, 1.0, 0.5, seed=0)
    loss_fn = torch.nn.CrossEntropyLoss()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    step, waited, timed = 0, 0.0, 0.0
    while step < a.warmup + a.steps:
        it = iter(loader)
        while step < a.warmup + a.steps:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            x = x.to(a.device, non_blocking=True).to(memory_format=torch.channels_last)
            y = y.to(a.device, non_blocking=True)
            sync()
            t1 = time.perf_counter()
            targets = None
            if mix.enabled:
                x, targets = mix(x, y, classes, 0.0)
            with torch.autocast(a.device, dtype=torch.bfloat16, enabled=cuda):
                logits = model(x)
            if targets is None:
                loss = loss_fn(logits, y)
            else:  # the mixed soft targets' cross-entropy (timm's SoftTargetCrossEntropy)
                loss = torch.sum(-targets * torch.log_softmax(logits.float(), dim=-1), dim=-1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sync()
            t2 = time.perf_counter()
            if step >= a.warmup:
                waited += t1 - t0
                timed += t2 - t0
            step += 1
    what = ("cifar10 resnet18-cifar" if a.cifar else "imagefolder resnet50") + (" augmented" if a.augment else "")
    print(f"pytorch {what} {'bf16' if cuda else 'fp32'} batch {a.batch} workers {a.workers}: "
          f"{a.steps * a.batch / timed:.0f} img/s, data_wait {100 * waited / timed:.1f}%")


if __name__ == "__main__":
    main()
