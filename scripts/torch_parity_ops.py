"""The transformer ops (GELU in both forms, layer norm over the last dimension and over channels,
softmax) against PyTorch in float64: outputs and every input's gradient for the seed gradient that
build/ops_parity wrote, to 1e-12 relative to each tensor's largest magnitude.

    build/ops_parity /tmp/ops && python3 scripts/torch_parity_ops.py /tmp/ops
"""
import sys

import torch
import torch.nn.functional as F

from torch_parity import load_safetensors  # our reader: no safetensors package needed

TOLERANCE = 1e-12


def load(path):
    tensors = load_safetensors(path)
    for name, t in tensors.items():
        assert t.dtype == torch.float64, f"{name}: expected F64, got {t.dtype}"
    return tensors


def reference(op, inputs):
    if op == "gelu":
        return F.gelu(inputs["x"])
    if op == "gelu_tanh":
        return F.gelu(inputs["x"], approximate="tanh")
    if op == "layer_norm":
        return F.layer_norm(inputs["x"], (37,), inputs["weight"], inputs["bias"], 1e-5)
    if op == "layer_norm_channels":  # torchvision's ConvNeXt LayerNorm2d
        x = inputs["x"].permute(0, 2, 3, 1)
        return F.layer_norm(x, (7,), inputs["weight"], inputs["bias"], 1e-6).permute(0, 3, 1, 2)
    if op == "softmax":
        return torch.softmax(inputs["x"], dim=-1)
    raise KeyError(op)


def main():
    ours = load(sys.argv[1] + "/ops.safetensors")
    ops = sorted({k.split(".")[0] for k in ours})
    worst = 0.0
    for op in ops:
        names = [k.split(".", 1)[1] for k in ours if k.startswith(op + ".")]
        inputs = {n: ours[f"{op}.{n}"].clone().requires_grad_(True) for n in names
                  if n not in ("y", "seed") and not n.startswith("grad_")}
        y = reference(op, inputs)
        y.backward(ours[f"{op}.seed"])
        pairs = [("y", y.detach())] + [("grad_" + n, t.grad) for n, t in inputs.items()]
        for name, expected in pairs:
            got = ours[f"{op}.{name}"]
            error = ((got - expected).abs().max() / expected.abs().max().clamp_min(1e-300)).item()
            worst = max(worst, error)
            print(f"{op:20s} {name:12s} max rel error {error:.2e}")
    print(f"worst {worst:.2e} (tolerance {TOLERANCE:.0e})")
    sys.exit(0 if worst <= TOLERANCE else 1)


if __name__ == "__main__":
    main()
