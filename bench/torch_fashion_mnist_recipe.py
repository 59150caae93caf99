#!/usr/bin/env python3
"""The recipe of one of our Fashion-MNIST configs trained in PyTorch, for issues 38 and 39's "the same
recipe written in PyTorch": reads the TOML (every key over configs/reference.toml's defaults, --set as the
trainer takes it; a key this script does not implement stops it unless it keeps its default), reads the
same IDX .gz files, trains, and prints per-epoch lines and the final line in the trainer's shape, with the
training seconds (evaluation excluded, as the trainer's train_seconds). --summary writes the trainer's
summary.json keys.

Data: with only random crop + flip, the training set lives on the device as uint8 and each batch is
cropped and flipped there; with a per-image uint8 op ([augment] policy, color_jitter, random_erasing)
it goes through torchvision transforms in a DataLoader with --workers processes, as a PyTorch user runs
them (--loader forces either). Normalisation, Mixup/CutMix and the loss run on the device.

    python3 bench/torch_fashion_mnist_recipe.py configs/fashion_mnist_vit.toml --set train.seed=1
    python3 bench/torch_fashion_mnist_recipe.py configs/fashion_mnist_resnet18.toml --compile \\
        --data-root /usr/share/datasets/fashion-mnist --summary /tmp/torch_fm18.json
Keep it runnable on torch 1.13 / torchvision 0.14 (Debian) and PyTorch 2.x alike.
"""
import argparse
import gzip
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms as T

from torch_batch_mix import BatchMix, smoothed_one_hot
from torch_recipe_config import ConfigError, check_implemented, load_config, require
from torch_recipe_parts import WeightAverage, build_model, param_groups, schedule_factor

IMPLEMENTED = {
    "model": {"name", "stem", "num_classes", "in_channels", "dropout", "patch_size", "depth", "heads", "mlp_dim",
              "width"},
    "data": {"dataset", "batch_size", "eval_batch_size", "shuffle", "drop_last", "random_crop_padding", "hflip",
             "normalize_mean", "normalize_std", "image_size"},
    "augment": {"policy", "randaugment_ops", "randaugment_magnitude", "magnitude_bins", "color_jitter",
                "random_erasing", "erasing_scale", "erasing_ratio", "erasing_value"},
    "train": {"epochs", "max_steps", "precision", "seed", "label_smoothing", "loss", "loss_scale_init",
              "eval_every_epochs", "target_accuracy"},
    "optim": {"name", "lr", "momentum", "nesterov", "weight_decay", "no_decay_bn_bias", "betas", "eps",
              "clip_grad_norm", "lr_scaling", "base_batch_size"},
    "schedule": {"name", "warmup_epochs", "warmup_start_factor", "step_epochs", "milestones", "gamma",
                 "min_lr_factor"},
    "mixup": {"mixup_alpha", "cutmix_alpha", "prob", "switch_prob"},
    "ema": {"enabled", "decay", "warmup", "warmup_gamma", "warmup_power", "min_decay", "every_steps",
            "average_buffers"},
}
FASHION_MNIST_MEAN, FASHION_MNIST_STD = [0.2860], [0.3530]  # data/fashion_mnist.h
SIDE, CLASSES = 28, 10


def read_idx(root, stem):
    """An IDX file (gzip-compressed or not) as a numpy array of its dimensions."""
    for name in (stem + ".gz", stem):
        path = os.path.join(root, name)
        if os.path.exists(path):
            with (gzip.open if name.endswith(".gz") else open)(path, "rb") as f:
                raw = f.read()
            dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(raw[3])]
            return np.frombuffer(raw, np.uint8, offset=4 + 4 * len(dims)).reshape(dims)
    sys.exit(f"error: {os.path.join(root, stem)}(.gz) not found. HINT: pass --data-root (Debian's "
             "dataset-fashion-mnist package installs /usr/share/datasets/fashion-mnist)")


def read_split(root, split):
    """uint8 [N, 1, 28, 28] images and int64 [N] labels."""
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(root, f"{prefix}-images-idx3-ubyte")
    labels = read_idx(root, f"{prefix}-labels-idx1-ubyte")
    return torch.from_numpy(images.copy())[:, None], torch.from_numpy(labels.astype(np.int64))


class EraseUint8:
    """RandomErasing on the uint8 image before normalisation, as the trainer does (data/augment/erasing.h):
    torchvision's box (RandomErasing.get_params), filled with 0 or uniform random bytes."""

    def __init__(self, p, scale, ratio, value):
        self.p, self.scale, self.ratio, self.value = p, tuple(scale), tuple(ratio), value

    def __call__(self, img):
        if not torch.rand(1) < self.p:
            return img
        top, left, h, w, _ = T.RandomErasing.get_params(img, self.scale, self.ratio, value=[0])
        if (h, w) == tuple(img.shape[-2:]):  # every attempt failed: torchvision leaves the image alone
            return img
        img = img.clone()
        box = img[..., top:top + h, left:left + w]
        box.copy_(torch.randint(0, 256, box.shape, dtype=torch.uint8) if self.value == "random" else 0)
        return img


class Contiguous:
    """torchvision 0.14's equalize views its input flat, which a crop's strided view refuses."""

    def __call__(self, img):
        return img.contiguous()


def per_image_transforms(d, a):
    """The uint8 transforms in the trainer's (torchvision's) order: crop, flip, policy, jitter, erasing."""
    steps = []
    if d["random_crop_padding"] > 0:
        steps.append(T.RandomCrop(SIDE, padding=d["random_crop_padding"]))
    if d["hflip"]:
        steps.append(T.RandomHorizontalFlip())
    steps.append(Contiguous())
    bins = a["magnitude_bins"]
    policies = {"none": None,
                "randaugment": lambda: T.RandAugment(a["randaugment_ops"], a["randaugment_magnitude"], bins),
                "trivialaugment": lambda: T.TrivialAugmentWide(bins),
                "autoaugment": lambda: T.AutoAugment(T.AutoAugmentPolicy.IMAGENET)}
    require(a["policy"] in policies, "augment.policy", f"'{a['policy']}' is not one of {list(policies)}")
    if a["policy"] != "none":
        steps.append(policies[a["policy"]]())
    if a["color_jitter"]:
        require(len(a["color_jitter"]) == 4, "augment.color_jitter", "takes 4 values")
        b, c, s, h = a["color_jitter"]
        steps.append(T.ColorJitter(b or None, c or None, s or None, h or None))
    if a["random_erasing"] > 0:
        steps.append(EraseUint8(a["random_erasing"], a["erasing_scale"], a["erasing_ratio"], a["erasing_value"]))
    return T.Compose(steps)


class AugmentedImages(torch.utils.data.Dataset):
    def __init__(self, images, labels, transform):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(self.images[i]), self.labels[i]


def device_batches(images, labels, d, generator):
    """An epoch's (uint8 [B, 1, 28, 28], labels) on the device, cropped and flipped per sample there."""
    n, b, pad = len(labels), d["batch_size"], d["random_crop_padding"]
    order = torch.randperm(n, generator=generator) if d["shuffle"] else torch.arange(n)
    end = n - n % b if d["drop_last"] else n
    for first in range(0, end, b):
        idx = order[first:first + b].to(images.device)
        x = images[idx]  # [B, 1, 28, 28]
        if pad > 0:  # torchvision RandomCrop(28, padding): zero padding, a window at a uniform offset
            padded = F.pad(x, (pad, pad, pad, pad))
            top = torch.randint(0, 2 * pad + 1, (len(idx), 1, 1), device=x.device)
            left = torch.randint(0, 2 * pad + 1, (len(idx), 1, 1), device=x.device)
            rows = top + torch.arange(SIDE, device=x.device)[None, :, None]  # [B, 28, 1]
            cols = left + torch.arange(SIDE, device=x.device)[None, None, :]  # [B, 1, 28]
            x = padded[torch.arange(len(idx), device=x.device)[:, None, None], :, rows, cols]  # [B, 28, 28, 1]
            x = x.permute(0, 3, 1, 2)
        if d["hflip"]:
            flip = torch.rand(len(idx), device=x.device) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(3), x)
        yield x, labels[idx]


def worker_batches(loader, device):
    for x, y in loader:
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def make_optimizer(c, model, fused):
    """[optim]'s SGD or AdamW over the weight-decay groups, and its peak LR (optim.lr_scaling applied)."""
    o = c["optim"]
    lr = o["lr"]
    require(o["lr_scaling"] in ("none", "linear"), "optim.lr_scaling", "is not none or linear")
    if o["lr_scaling"] == "linear":
        lr *= c["data"]["batch_size"] / o["base_batch_size"]
    groups = param_groups(model, o["weight_decay"], o["no_decay_bn_bias"])
    kernel = {"fused": True} if fused else {}  # PyTorch 2: AdamW from 2.0, SGD from 2.4
    if o["name"] == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=o["momentum"], nesterov=o["nesterov"], **kernel), lr
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(o["betas"]), eps=o["eps"], **kernel), lr


class Run:
    """The device, precision, model, optimizer, schedule and weight average of one config."""

    def __init__(self, c, args):
        t, o = c["train"], c["optim"]
        dev = t["device"] if t["device"] != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(dev)
        # torch 1.13's CPU autocast breaks the ViT's attention in eval mode; the trainer too runs bf16 on GPUs only
        require(self.device.type == "cuda" or t["precision"] in ("fp32", "tf32"), "train.precision",
                f"{t['precision']} is a GPU precision. HINT: on a CPU add --set train.precision=fp32")
        torch.manual_seed(t["seed"])
        precisions = ("fp32", "tf32", "bf16", "fp16")
        require(t["precision"] in precisions, "train.precision", f"is not one of {precisions}")
        self.precision = t["precision"]
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = self.precision != "fp32"
        torch.backends.cudnn.benchmark = True
        self.half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        self.scaler = None
        if self.precision == "fp16":
            scaler = torch.amp.GradScaler if hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler
            self.scaler = scaler(init_scale=t["loss_scale_init"], growth_interval=2000)
        m = build_model(c["model"], 1, CLASSES, SIDE).to(self.device)
        # channels-last convolutions for the ResNets on a GPU, as a PyTorch user runs them in half precision
        self.channels_last = self.device.type == "cuda" and c["model"]["name"] != "vit"
        if self.channels_last:
            m = m.to(memory_format=torch.channels_last)
        self.model = m
        self.parameters = sum(p.numel() for p in m.parameters())
        e = c["ema"]
        self.ema = WeightAverage(m, e) if e["enabled"] and e["decay"] > 0 else None
        self.net = m
        if args.compile:
            require(hasattr(torch, "compile"), "--compile", f"torch {torch.__version__} has no torch.compile")
            self.net = torch.compile(m)
        self.optimizer, self.base_lr = make_optimizer(c, m, args.fused)
        self.clip = o["clip_grad_norm"]

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.half, enabled=self.half is not None)

    def prepare(self, x_u8, mean, std):
        """uint8 [B, C, H, W] -> float32 (x / 255 - mean) / std, channels-last where the model is."""
        x = (x_u8.float() / 255.0 - mean) / std
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x.contiguous()

    def step(self, loss):
        """backward, clipping, the update; returns whether the update was skipped (fp16 overflow)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            if self.clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.optimizer.step()
            return False
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return self.scaler.get_scale() < scale


def training_loss(t, logits, labels, soft_targets):
    """train.loss on float32 logits: cross-entropy (label-smoothed, or on the mixed targets) or BCE."""
    logits = logits.float()
    if t["loss"] == "bce":
        targets = soft_targets if soft_targets is not None else smoothed_one_hot(
            labels, logits.shape[1], t["label_smoothing"])
        return F.binary_cross_entropy_with_logits(logits, targets)
    if soft_targets is not None:
        return torch.sum(-soft_targets * F.log_softmax(logits, dim=-1), dim=-1).mean()
    return F.cross_entropy(logits, labels, label_smoothing=t["label_smoothing"])


@torch.no_grad()
def evaluate(run, model, test, mean, std, batch):
    """(plain cross-entropy on hard labels, top-1, top-5) over the test split."""
    images, labels = test
    model.eval()
    loss = top1 = top5 = 0.0
    for first in range(0, len(labels), batch):
        x = run.prepare(images[first:first + batch], mean, std)
        y = labels[first:first + batch]
        with run.autocast():
            logits = model(x).float()
        loss += F.cross_entropy(logits, y, reduction="sum").item()
        best5 = logits.topk(5, dim=1).indices
        top1 += (best5[:, 0] == y).sum().item()
        top5 += (best5 == y[:, None]).any(dim=1).sum().item()
    model.train()
    n = len(labels)
    return loss / n, top1 / n, top5 / n


def validate(c):
    d, t = c["data"], c["train"]
    require(d["dataset"] == "fashion_mnist", "data.dataset", "this script trains Fashion-MNIST only")
    require(d["image_size"] in (0, SIDE), "data.image_size", "Fashion-MNIST is 28x28")
    require(t["loss"] in ("cross_entropy", "bce"), "train.loss", "is not cross_entropy or bce")
    require(not d["normalize_mean"] or len(d["normalize_mean"]) == 1, "data.normalize_mean", "takes 1 value")
    require(c["optim"]["name"] in ("sgd", "adamw"), "optim.name", f"'{c['optim']['name']}': only sgd and adamw here")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="one of our TOML configs, e.g. configs/fashion_mnist_vit.toml")
    p.add_argument("--data-root", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="as the trainer's --set (e.g. train.seed=1)")
    p.add_argument("--max-steps", type=int, help="the same as --set train.max_steps=N")
    p.add_argument("--workers", type=int, default=8, help="DataLoader worker processes (per-image augmentations)")
    p.add_argument("--loader", choices=("auto", "workers", "device"), default="auto",
                   help="auto: a DataLoader only when a per-image uint8 augmentation is on")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (PyTorch 2)")
    p.add_argument("--fused", action="store_true", help="the optimizer's fused CUDA kernel (PyTorch 2)")
    p.add_argument("--summary", help="write the trainer's summary.json keys here")
    return p.parse_args()


def make_batches(c, args, train, device):
    """A function epoch -> iterator of (uint8 batch, labels) on the device, and the steps per epoch."""
    d, a = c["data"], c["augment"]
    per_image = a["policy"] != "none" or bool(a["color_jitter"]) or a["random_erasing"] > 0
    use_workers = args.loader == "workers" or (args.loader == "auto" and per_image)
    require(use_workers or not per_image, "--loader device", "runs crop and flip only, not [augment]")
    n, b = len(train[1]), d["batch_size"]
    steps = n // b if d["drop_last"] else math.ceil(n / b)
    generator = torch.Generator().manual_seed(c["train"]["seed"])
    if not use_workers:
        images, labels = train[0].to(device), train[1].to(device)
        return (lambda epoch: device_batches(images, labels, d, generator)), steps, "device"
    loader = torch.utils.data.DataLoader(
        AugmentedImages(train[0], train[1], per_image_transforms(d, a)), batch_size=b, shuffle=d["shuffle"],
        drop_last=d["drop_last"], num_workers=args.workers, pin_memory=device.type == "cuda",
        persistent_workers=args.workers > 0, generator=generator)
    return (lambda epoch: worker_batches(loader, device)), steps, f"DataLoader, {args.workers} workers"


def ema_part(run, test, mean, std, batch):
    if run.ema is None:
        return "", None
    start = time.perf_counter()
    loss, top1, top5 = evaluate(run, run.ema.model, test, mean, std, batch)
    return (f" | EMA test loss {loss:.4f} top1 {100 * top1:.2f}% top5 {100 * top5:.2f}% "
            f"({time.perf_counter() - start:.1f}s)"), top1


def main():
    args = parse_args()
    overrides = args.set + ([f"train.max_steps={args.max_steps}"] if args.max_steps else [])
    try:
        c = load_config(args.config, overrides)
        check_implemented(c, IMPLEMENTED)
        validate(c)
        run = Run(c, args)
        train, test = read_split(args.data_root, "train"), read_split(args.data_root, "test")
        batches, steps_per_epoch, loader_kind = make_batches(c, args, train, run.device)
        t, d = c["train"], c["data"]
        schedule_steps = steps_per_epoch * t["epochs"]
        factor = schedule_factor(c["schedule"], steps_per_epoch, schedule_steps)
    except ConfigError as err:
        sys.exit(f"{args.config}: error: {err}")
    total_steps = min(schedule_steps, t["max_steps"]) if t["max_steps"] > 0 else schedule_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, factor)
    m = c["mixup"]
    mix = BatchMix(m["mixup_alpha"], m["cutmix_alpha"], m["prob"], m["switch_prob"], t["seed"])
    mean = torch.tensor(d["normalize_mean"] or FASHION_MNIST_MEAN, device=run.device).view(1, -1, 1, 1)
    std = torch.tensor(d["normalize_std"] or FASHION_MNIST_STD, device=run.device).view(1, -1, 1, 1)
    test = (test[0].to(run.device), test[1].to(run.device))
    gpu = torch.cuda.get_device_name() if run.device.type == "cuda" else "cpu"
    print(f"pytorch {torch.__version__} on {run.device} ({gpu}): {c['model']['name']} {run.parameters} parameters, "
          f"{t['precision']}, batch {d['batch_size']}, {steps_per_epoch} steps/epoch x {t['epochs']} epochs "
          f"({total_steps} steps), lr {run.base_lr:g}, {c['optim']['name']}, {c['schedule']['name']}, "
          f"data: {loader_kind}, mixup {'on' if mix.enabled else 'off'}, EMA {'on' if run.ema else 'off'}"
          f"{', torch.compile' if args.compile else ''}", flush=True)
    summary = train_epochs(c, run, batches, scheduler, mix, test, mean, std, total_steps)
    print(f"done: {summary['steps']} steps in {summary['duration']} ({summary['samples_per_second']:.0f} img/s), "
          f"final test accuracy {100 * summary['final_test_accuracy']:.2f}%, "
          f"best {100 * summary['best_test_accuracy']:.2f}%")
    print(f"train seconds {summary['train_seconds']:.2f} (training only, evaluation excluded; "
          f"wall {summary['wall_seconds']:.1f} s)")
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump({k: v for k, v in summary.items() if k != "duration"}, f, indent=2)


def train_epochs(c, run, batches, scheduler, mix, test, mean, std, total_steps):
    """The loop: the trainer's epoch lines, evaluation after every train.eval_every_epochs and the last."""
    t, d = c["train"], c["data"]
    s = {"steps": 0, "train_seconds": 0.0, "best_test_accuracy": 0.0, "samples": 0}
    wall = time.perf_counter()
    for epoch in range(t["epochs"]):
        start, loss_sum, epoch_steps, samples_before = time.perf_counter(), 0.0, 0, s["samples"]
        for x_u8, labels in batches(epoch):
            if s["steps"] >= total_steps:
                break
            x = run.prepare(x_u8, mean, std)
            soft = None
            if mix.enabled or t["loss"] == "bce":
                x, soft = mix(x, labels, CLASSES, t["label_smoothing"])
            with run.autocast():
                logits = run.net(x)
            loss = training_loss(t, logits, labels, soft)
            skipped = run.step(loss)
            scheduler.step()
            if run.ema:
                run.ema.after_optimizer_step(skipped)
            loss_sum = loss_sum + loss.detach()
            epoch_steps += 1
            s["steps"] += 1
            s["samples"] += len(labels)
        if run.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        s["train_seconds"] += seconds
        s["final_train_loss"] = float(loss_sum / max(epoch_steps, 1))
        last = s["steps"] >= total_steps or epoch + 1 == t["epochs"]
        every = t["eval_every_epochs"]
        line = (f"epoch {epoch + 1}/{t['epochs']}: train loss {s['final_train_loss']:.4f}, {seconds:.1f}s, "
                f"{(s['samples'] - samples_before) / max(seconds, 1e-9):.0f} img/s")
        if last or (every > 0 and (epoch + 1) % every == 0):
            eval_start = time.perf_counter()
            loss, top1, top5 = evaluate(run, run.net, test, mean, std, d["eval_batch_size"])
            s.update(final_test_accuracy=top1, final_test_top5=top5, final_test_loss=loss)
            s["best_test_accuracy"] = max(s["best_test_accuracy"], top1)
            line += (f" | test loss {loss:.4f} top1 {100 * top1:.2f}% top5 {100 * top5:.2f}% "
                     f"({len(test[1])} images, {time.perf_counter() - eval_start:.1f}s)")
            ema_line, ema_top1 = ema_part(run, test, mean, std, d["eval_batch_size"])
            if ema_top1 is not None:
                s["final_ema_test_accuracy"] = ema_top1
                s["best_ema_test_accuracy"] = max(s.get("best_ema_test_accuracy", 0.0), ema_top1)
            line += ema_line
            if t["target_accuracy"] > 0 and top1 >= t["target_accuracy"]:
                line += f" | target {100 * t['target_accuracy']:.2f}% reached"
                last = True
        print(line, flush=True)
        if last:
            s["epochs"] = epoch + 1
            break
    s["wall_seconds"] = time.perf_counter() - wall
    s["samples_per_second"] = s.pop("samples") / max(s["train_seconds"], 1e-9)
    secs = round(s["train_seconds"])
    s["duration"] = f"{secs // 3600}h{secs // 60 % 60:02d}m" if secs >= 3600 else f"{secs // 60}m{secs % 60:02d}s"
    return s


if __name__ == "__main__":
    main()
