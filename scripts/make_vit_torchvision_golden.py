#!/usr/bin/env python3
"""Writes torchvision's vit_b_16 and its logits on a fixed batch, for our vit_b_16 to reproduce.

    python3 scripts/make_vit_torchvision_golden.py OUT_DIR

OUT_DIR/vit_b_16.safetensors: the state dict of torchvision.models.vit_b_16() built under
torch.manual_seed(0), with heads.head drawn from normal(std 0.02) instead of torchvision's zeros (zero
logits would check nothing). Our load_module reads it strictly: every name, shape and dtype must be
ours, and nothing else may be in the file.

OUT_DIR/vit_b_16_logits.safetensors: `images` [2, 3, 224, 224] (normal, seed 1), torchvision's
`logits` [2, 1000] in eval mode, float32 on the CPU, and `pos_embedding_384`, the position embedding
resized for 384x384 images by torchvision's interpolate_embeddings (bicubic), for our
interpolate_position_embedding.

tests/nn/vit_torchvision_test.cpp compares (it skips without these files); ctest runs both through
scripts/torchvision_model_check.sh vit_b_16 (torchvision_vit_b_16, skipped without PyTorch and torchvision).
"""
import os
import sys

import torch
import torchvision
from torchvision.models.vision_transformer import interpolate_embeddings

from make_torch_golden import save_safetensors  # our writer: no safetensors package needed


def seeded_vit_b_16(num_classes=1000):
    """torchvision's vit_b_16 under torch.manual_seed(0), its zero head redrawn (normal, std 0.02)."""
    torch.manual_seed(0)
    model = torchvision.models.vit_b_16(num_classes=num_classes)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(2)
        model.heads.head.weight.copy_(torch.randn(model.heads.head.weight.shape, generator=gen) * 0.02)
        model.heads.head.bias.copy_(torch.randn(model.heads.head.bias.shape, generator=gen) * 0.02)
    return model


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    model = seeded_vit_b_16()
    state = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    metadata = {"torch": torch.__version__, "torchvision": torchvision.__version__, "seed": "0"}
    save_safetensors(os.path.join(out, "vit_b_16.safetensors"), state, metadata)

    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model.eval()(images)
    resized = interpolate_embeddings(384, 16, {"encoder.pos_embedding": state["encoder.pos_embedding"]})
    tensors = {"images": images, "logits": logits.float(), "pos_embedding_384": resized["encoder.pos_embedding"]}
    save_safetensors(os.path.join(out, "vit_b_16_logits.safetensors"), tensors, metadata)
    print(f"{out}: vit_b_16 ({sum(t.numel() for t in state.values())} parameters), logits {list(logits.shape)}, "
          f"torch {torch.__version__}, torchvision {torchvision.__version__}")


if __name__ == "__main__":
    main()
