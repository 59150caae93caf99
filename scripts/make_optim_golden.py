"""Golden values for the weight average (timm's ModelEmaV3) and the layer-wise adaptive optimizers
(timm's Lamb and Lars), computed in float64 with PyTorch by a transcription of timm's documented
algorithms (timm is not in Debian; this is our own code, written from timm's Lamb, Lars and
ModelEmaV3 source, not a copy). tests/nn/optim_golden_test.cpp runs our optimizers on the same inputs
and requires every value within 1e-6.

    python3 scripts/make_optim_golden.py tests/nn/golden/optim_lamb_lars_ema.safetensors
"""
import json
import struct
import sys

import torch

torch.manual_seed(39)
DT = torch.float64
SHAPES = {"w": (4, 5), "b": (5,), "k": (3, 2, 2)}  # "b" is 1-D: weight decay 0 (no adaptation)
STEPS = 3


def lerp(a, b, w):
    return torch.lerp(a, b, w)


# ---- timm's Lamb (always_adapt False, grad averaging, bias correction, coupled decay)
def lamb(params, grads_per_step, lr, wd, max_grad_norm, trust_clip, beta1=0.9, beta2=0.999, eps=1e-6):
    p = {k: v.clone() for k, v in params.items()}
    m = {k: torch.zeros_like(v) for k, v in p.items()}
    v2 = {k: torch.zeros_like(v) for k, v in p.items()}
    for step, grads in enumerate(grads_per_step, start=1):
        clip = None
        if max_grad_norm > 0:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
            clip = (norm / max_grad_norm).clamp(min=1.0)
        bc1 = 1 - beta1 ** step
        bc2 = 1 - beta2 ** step
        for k in p:
            g = grads[k] if clip is None else grads[k] / clip
            group_wd = 0.0 if p[k].dim() <= 1 else wd
            m[k] = lerp(m[k], g, 1 - beta1)
            v2[k] = v2[k] * beta2 + (1 - beta2) * g * g
            update = (m[k] / bc1) / (v2[k].sqrt() / bc2 ** 0.5 + eps)
            if group_wd != 0:
                update = update + group_wd * p[k]
                w_norm, u_norm = p[k].norm(), update.norm()
                ratio = w_norm / u_norm if (w_norm > 0 and u_norm > 0) else torch.tensor(1.0, dtype=DT)
                if trust_clip:
                    ratio = ratio.clamp(max=1.0)
                update = update * ratio
            p[k] = p[k] - lr * update
    return p, m, v2


# ---- timm's Lars (always_adapt False)
def lars(params, grads_per_step, lr, wd, momentum, dampening, nesterov, trust_coeff, eps, trust_clip):
    p = {k: v.clone() for k, v in params.items()}
    buf = {}
    for grads in grads_per_step:
        for k in p:
            g = grads[k]
            group_wd = 0.0 if p[k].dim() <= 1 else wd
            if group_wd != 0:
                w_norm, g_norm = p[k].norm(), g.norm()
                ratio = trust_coeff * w_norm / (g_norm + w_norm * group_wd + eps)
                if not (w_norm > 0 and g_norm > 0):
                    ratio = torch.tensor(1.0, dtype=DT)
                if trust_clip:
                    ratio = (ratio / lr).clamp(max=1.0)
                g = (g + group_wd * p[k]) * ratio
            if momentum != 0:
                if k not in buf:
                    buf[k] = g.clone()
                else:
                    buf[k] = buf[k] * momentum + (1 - dampening) * g
                g = g + momentum * buf[k] if nesterov else buf[k]
            p[k] = p[k] - lr * g
    return p, buf


# ---- timm's ModelEmaV3.get_decay and apply_update_ (buffers averaged, integers copied)
def ema_decay(step, decay, warmup, gamma=1.0, power=2 / 3, min_decay=0.0):
    step = max(0, step - 1)
    if step <= 0:
        return 0.0
    if warmup:
        d = 1 - (1 + step / gamma) ** -power
        return max(min(d, decay), min_decay)
    return decay


def ema(states, decay, warmup):
    average = {k: v.clone() for k, v in states[0].items()}  # ModelEmaV3 starts as a copy of the model
    for step, state in enumerate(states, start=1):
        d = ema_decay(step, decay, warmup)
        for k, v in state.items():
            if v.is_floating_point():
                average[k] = torch.lerp(average[k], v, 1.0 - d)
            else:
                average[k] = v.clone()
    return average


def save(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        dtype = {torch.float64: "F64", torch.int64: "I64"}[t.dtype]
        raw = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    out = {}
    params = {k: torch.randn(s, dtype=DT) for k, s in SHAPES.items()}
    grads = [{k: 3.0 * torch.randn(s, dtype=DT) for k, s in SHAPES.items()} for _ in range(STEPS)]
    for k in params:
        out[f"input.param.{k}"] = params[k]
        for i, step_grads in enumerate(grads):
            out[f"input.grad{i}.{k}"] = step_grads[k]
    cases = {
        "lamb": dict(lr=0.01, wd=0.05, max_grad_norm=1.0, trust_clip=False),
        "lambc": dict(lr=0.02, wd=0.01, max_grad_norm=0.0, trust_clip=True),
    }
    for name, c in cases.items():
        p, m, v = lamb(params, grads, **c)
        for k in p:
            out[f"{name}.param.{k}"], out[f"{name}.exp_avg.{k}"], out[f"{name}.exp_avg_sq.{k}"] = p[k], m[k], v[k]
    cases = {
        "lars": dict(lr=0.5, wd=1e-4, momentum=0.9, dampening=0.1, nesterov=False, trust_coeff=1e-3, eps=1e-8,
                     trust_clip=False),
        "larc": dict(lr=0.002, wd=5e-4, momentum=0.9, dampening=0.0, nesterov=True, trust_coeff=0.02, eps=1e-8,
                     trust_clip=True),
    }
    for name, c in cases.items():
        p, buf = lars(params, grads, **c)
        for k in p:
            out[f"{name}.param.{k}"], out[f"{name}.momentum_buffer.{k}"] = p[k], buf[k]
    # A BatchNorm2d(3)'s state dict over 7 optimizer updates.
    states = [{"weight": torch.randn(3, dtype=DT), "bias": torch.randn(3, dtype=DT),
               "running_mean": torch.randn(3, dtype=DT), "running_var": torch.rand(3, dtype=DT) + 0.5,
               "num_batches_tracked": torch.tensor(i + 1, dtype=torch.int64)} for i in range(7)]
    for i, s in enumerate(states):
        for k, t in s.items():
            out[f"ema_input{i}.{k}"] = t
    for name, decay, warmup in (("ema_warmup", 0.999, True), ("ema_plain", 0.8, False)):
        for k, t in ema(states, decay, warmup).items():
            out[f"{name}.{k}"] = t
    save(sys.argv[1], out)


if __name__ == "__main__":
    main()
