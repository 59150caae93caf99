#!/usr/bin/env python3
"""Writes torchvision's convnext_tiny and its logits on a fixed batch, for nn_tests to compare against.

    python3 scripts/torchvision_convnext_reference.py OUT_DIR

OUT_DIR/convnext_tiny.safetensors: the state dict of torchvision.models.convnext_tiny(num_classes=1000)
built with torch.manual_seed(0), then with every layer_scale, LayerNorm weight and LayerNorm bias
redrawn from a seeded generator (at torchvision's initial layer_scale of 1e-6 the blocks would add
almost nothing to the logits, and a mistake inside them would go unseen). Float32, torchvision's names.

OUT_DIR/convnext_tiny_logits.safetensors: "images" (float32 [2, 3, 64, 64], seeded normal) and "logits"
(float64 [2, 1000]) of the same model in eval mode, computed in float64.

nn_ConvNeXtTorchvision.* loads both (TRAINER_CONVNEXT_REFERENCE=OUT_DIR) into our convnext_tiny;
scripts/torchvision_model_check.sh convnext_tiny runs the two for ctest. Needs torch and torchvision only.
"""
import os
import sys

import torch
import torch.nn as nn
import torchvision

from make_torch_golden import save_safetensors  # our writer: no safetensors package needed

BATCH, IMAGE, SEED = 2, 64, 0


def seeded_convnext_tiny(num_classes=1000):
    """torchvision's convnext_tiny under torch.manual_seed(SEED), its layer scales and LayerNorm
    parameters redrawn so that the blocks count."""
    torch.manual_seed(SEED)
    model = torchvision.models.convnext_tiny(num_classes=num_classes)
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_scale"):
                p.copy_(torch.rand(p.shape, generator=gen) * 0.5 + 0.25)
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):  # torchvision's LayerNorm2d is a subclass
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=gen) * 0.2 - 0.1)
    return model, gen


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    model, gen = seeded_convnext_tiny()
    state = {k: v.clone() for k, v in model.state_dict().items()}  # float32, before widening
    save_safetensors(os.path.join(out, "convnext_tiny.safetensors"), state)
    images = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen)
    with torch.no_grad():
        logits = model.double().eval()(images.double())
    save_safetensors(os.path.join(out, "convnext_tiny_logits.safetensors"), {"images": images, "logits": logits})
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}: {len(state)} tensors, "
          f"{sum(v.numel() for v in state.values())} values, logits up to {logits.abs().max().item():.3f} -> {out}")


if __name__ == "__main__":
    main()
