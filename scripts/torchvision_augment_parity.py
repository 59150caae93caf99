"""data/augment/ against torchvision.transforms.functional (0.14, Debian's python3-torchvision; it has no
transforms.v2, so the reference is transforms.functional on uint8 tensors) on the images and cases that
build/augment_parity_dump wrote:

  - every op as autoaugment._apply_op applies it (the policies' own entry point) at the same signed
    magnitude, and ColorJitter's adjust_brightness/contrast/saturation/hue at the same factor:
    colour and histogram ops within 1 level everywhere (the count of exact matches is printed),
    geometric ops (ShearX/Y, TranslateX/Y, Rotate) within 1 level on at least 99% of the pixels;
  - RandAugment's, TrivialAugmentWide's and AutoAugment's _augmentation_space, entry by entry (op
    order, signedness, every magnitude as float32), and AutoAugment's ImageNet policy.

  python3 scripts/torchvision_augment_parity.py OUT_DIR
"""
import sys
from pathlib import Path

import numpy as np
import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F
from torchvision.transforms import autoaugment as AA

GEOMETRIC = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}


def read_image(path, h, w, c):
    return np.fromfile(path, dtype=np.uint8).reshape(h, w, c)


def torchvision_result(op, value, hwc):
    img = torch.from_numpy(hwc.copy()).permute(2, 0, 1).contiguous()  # [C, H, W] uint8
    if op.startswith("adjust_"):
        out = getattr(F, op)(img, value)
    else:
        out = AA._apply_op(img, op, value, interpolation=InterpolationMode.NEAREST, fill=None)
    return out.permute(1, 2, 0).numpy()


def check_cases(out_dir):
    images, stats, failures = {}, {}, []
    for line in (out_dir / "manifest.txt").read_text().splitlines():
        f = line.split()
        if f[0] == "image":
            k, h, w, c = map(int, f[1:])
            images[k] = read_image(out_dir / f"image_{k}.bin", h, w, c)
            continue
        n, k, op, value = int(f[1]), int(f[2]), f[3], float(f[4])
        ours = np.fromfile(out_dir / f"case_{n}.bin", dtype=np.uint8).reshape(images[k].shape)
        ref = torchvision_result(op, value, images[k])
        diff = np.abs(ours.astype(np.int32) - ref.astype(np.int32))
        s = stats.setdefault(op, {"cases": 0, "pixels": 0, "exact": 0, "within1": 0, "max": 0, "worst_within1": 1.0})
        s["cases"] += 1
        s["pixels"] += diff.size
        s["exact"] += int((diff == 0).sum())
        within1 = float((diff <= 1).mean())
        s["within1"] += int((diff <= 1).sum())
        s["max"] = max(s["max"], int(diff.max()))
        s["worst_within1"] = min(s["worst_within1"], within1)
        if op in GEOMETRIC:
            if within1 < 0.99:
                failures.append(f"case {n} {op}({value:g}) on image {k}: {100 * within1:.2f}% of pixels within 1 level")
        elif diff.max() > 1:
            failures.append(f"case {n} {op}({value:g}) on image {k}: max difference {diff.max()} levels")
    print(f"{'op':18} {'cases':>5} {'exact %':>9} {'<=1 %':>9} {'worst case <=1 %':>17} {'max diff':>8}")
    for op, s in stats.items():
        print(f"{op:18} {s['cases']:5d} {100 * s['exact'] / s['pixels']:9.4f} {100 * s['within1'] / s['pixels']:9.4f}"
              f" {100 * s['worst_within1']:17.4f} {s['max']:8d}")
    return failures


def reference_spaces(name, bins, h, w):
    if name == "randaugment":
        return AA.RandAugment(num_magnitude_bins=bins)._augmentation_space(bins, (h, w))
    if name == "trivialaugmentwide":
        return AA.TrivialAugmentWide(num_magnitude_bins=bins)._augmentation_space(bins)
    return AA.AutoAugment()._augmentation_space(bins, (h, w))


def check_tables(out_dir):
    failures, ours, policy, entries = [], {}, [], 0
    for line in (out_dir / "tables.txt").read_text().splitlines():
        f = line.split()
        if f[0] == "space":
            key = (f[1], int(f[2]), int(f[3]), int(f[4]))
            ours.setdefault(key, []).append((f[5], f[6] == "1", [float(v) for v in f[7:]]))
        else:
            policy.append((int(f[1]), f[2], float(f[3]), int(f[4])))
    for (name, bins, h, w), ops in ours.items():
        ref = reference_spaces(name, bins, h, w)
        where = f"{name}(bins={bins}, {h}x{w})"
        if [op for op, _, _ in ops] != list(ref.keys()):
            failures.append(f"{where}: ops {[op for op, _, _ in ops]} != torchvision's {list(ref.keys())}")
            continue
        for op, signed, values in ops:
            magnitudes, ref_signed = ref[op]
            ref_values = [] if magnitudes.ndim == 0 else magnitudes.to(torch.float32).tolist()
            entries += 1 + len(ref_values)
            if signed != ref_signed:
                failures.append(f"{where} {op}: signed {signed} != torchvision's {ref_signed}")
            if np.float32(values).tolist() != np.float32(ref_values).tolist():
                failures.append(f"{where} {op}: magnitudes {values} != torchvision's {ref_values}")
    ref_policy = [(i, op, p, -1 if m is None else m)
                  for i, pair in enumerate(AA.AutoAugment()._get_policies(AA.AutoAugmentPolicy.IMAGENET))
                  for op, p, m in pair]
    if policy != ref_policy:
        failures.append(f"AutoAugment ImageNet policy differs:\n ours {policy}\n torchvision {ref_policy}")
    print(f"tables: {len(ours)} augmentation spaces, {entries} entries (ops and magnitudes), "
          f"{len(policy)} policy steps compared")
    return failures


def main():
    out_dir = Path(sys.argv[1])
    failures = check_cases(out_dir) + check_tables(out_dir)
    for failure in failures:
        print("FAIL:", failure)
    if failures:
        sys.exit(1)
    print("torchvision_augment_parity: OK")


if __name__ == "__main__":
    main()
