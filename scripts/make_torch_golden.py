#!/usr/bin/env python3
"""Writes tests/nn/golden/resnet18_w4_sgd_step.safetensors: two SGD steps of a narrow resnet18 (CIFAR
stem, width 4, 16x16 inputs, batch 4) computed by PyTorch in float64, for the CPU golden test
(tests/nn/torch_golden_test.cpp) to compare our float32 step against under every OpenBLAS kernel set.

    /usr/bin/python3 scripts/make_torch_golden.py tests/nn/golden/resnet18_w4_sgd_step.safetensors

Why float64 and why a margin: a ReLU network's gradient is discontinuous where a pre-activation
crosses zero. Float32 rounding (~1e-7 relative per GEMM) moves pre-activations by ~1e-6 after a few
layers, so any element closer than that to zero may flip its ReLU mask and change a gradient by the
whole upstream value at that element: a max-error comparison then measures luck, not correctness
(resnet18-cifar at batch 8 has ~2.9 million pre-activations and its nearest one sits at 3e-7). This
script therefore draws inputs until every pre-activation is at least MARGIN from zero, so that a
correct float32 step must agree with the float64 reference to float32 accuracy, whatever the BLAS.

The model is written here, not taken from torchvision, so the reference shares no code with ours;
its names are torchvision's. The file holds init.* (the state before the steps), images and labels
([2, ...]: one batch per step), step<i>.loss, step<i>.logits and step<i>.grad.* (every parameter's
gradient in step i), and after.* (the state after both steps: the second uses the momentum buffer).
"""
import json
import struct
import sys

import torch
import torch.nn as nn

WIDTH, IMAGE, BATCH, CLASSES = 4, 16, 4, 10
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 5e-4
MARGIN = 1e-4


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x, pre):
        h = self.bn1(self.conv1(x))
        pre.append(h)
        h = self.bn2(self.conv2(torch.relu(h)))
        h = h + (self.downsample(x) if self.downsample is not None else x)
        pre.append(h)
        return torch.relu(h)


class NarrowResNet18(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.conv1 = nn.Conv2d(3, w, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        widths = [w, 2 * w, 4 * w, 8 * w]
        cin = w
        for i, cout in enumerate(widths):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}", nn.Sequential(Block(cin, cout, stride), Block(cout, cout, 1)))
            cin = cout
        self.fc = nn.Linear(8 * w, CLASSES)

    def forward(self, x, pre):
        h = self.bn1(self.conv1(x))
        pre.append(h)
        h = torch.relu(h)
        for i in range(4):
            for block in getattr(self, f"layer{i + 1}"):
                h = block(h, pre)
        return self.fc(h.mean(dim=(2, 3)))


def init_weights(model, gen):
    for m in model.modules():  # torchvision's scheme: kaiming normal fan_out for convolutions
        if isinstance(m, nn.Conv2d):
            fan_out = m.out_channels * m.kernel_size[0] * m.kernel_size[1]
            with torch.no_grad():
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * (2.0 / fan_out) ** 0.5)
    with torch.no_grad():
        bound = 1.0 / (8 * WIDTH) ** 0.5
        model.fc.weight.copy_((torch.rand(model.fc.weight.shape, generator=gen) * 2 - 1) * bound)
        model.fc.bias.copy_((torch.rand(model.fc.bias.shape, generator=gen) * 2 - 1) * bound)


def save_safetensors(path, tensors, metadata=None):
    names = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}
    header, blobs, offset = ({"__metadata__": metadata} if metadata else {}), [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().cpu().numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    out = sys.argv[1]
    # Two steps on two batches, so that the second exercises SGD's momentum buffer (the first step only
    # sets it to the gradient); every pre-activation of both forward passes keeps the margin.
    for seed in range(5000):
        gen = torch.Generator().manual_seed(seed)
        model = NarrowResNet18(WIDTH)
        init_weights(model, gen)
        images = torch.randn(2, BATCH, 3, IMAGE, IMAGE, generator=gen)
        labels = torch.randint(0, CLASSES, (2, BATCH), generator=gen)
        init = {k: v.clone() for k, v in model.state_dict().items()}
        model = model.double().train()
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        margin, steps = float("inf"), []
        for i in range(2):
            pre = []
            logits = model(images[i].double(), pre)
            margin = min(margin, min(p.abs().min().item() for p in pre))
            loss = nn.functional.cross_entropy(logits, labels[i])
            opt.zero_grad()
            loss.backward()
            steps.append((loss.detach(), logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
            opt.step()
        if margin >= MARGIN:
            break
    else:
        sys.exit("no seed below 5000 gives every pre-activation a margin of %g" % MARGIN)
    tensors = {f"init.{k}": v for k, v in init.items()}
    tensors.update({"images": images, "labels": labels})
    for i, (loss, logits, grads) in enumerate(steps):
        tensors[f"step{i}.loss"] = loss.float().reshape(1)
        tensors[f"step{i}.logits"] = logits.float()
        tensors.update({f"step{i}.grad.{n}": g.float() for n, g in grads.items()})
    tensors.update({f"after.{k}": v.float() if v.is_floating_point() else v for k, v in model.state_dict().items()})
    metadata = {"seed": str(seed), "margin": "%.3e" % margin, "torch": torch.__version__,
                "step": f"SGD lr {LR} momentum {MOMENTUM} weight_decay {WEIGHT_DECAY}, float64"}
    save_safetensors(out, tensors, metadata)
    print(f"{out}: seed {seed}, nearest pre-activation {margin:.2e}, {len(tensors)} tensors, torch {torch.__version__}")


if __name__ == "__main__":
    main()
