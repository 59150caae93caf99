#!/usr/bin/env python3
"""A CIFAR-10 set in the binary version's format (data_batch_1..5.bin, test_batch.bin: a label byte and
3072 pixel bytes, channel by channel), for loader and training benchmarks on hosts without the real
files. Each class is a smooth random pattern plus noise, so that the images compress and train like
pictures, not like white noise; the loader's speed does not depend on the content.

    python3 bench/make_cifar_bin.py /tmp/cifar-10-batches-bin
"""
import os
import sys

import numpy as np


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/cifar-10-batches-bin"
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    patterns = rng.integers(0, 256, size=(10, 3, 8, 8)).repeat(4, axis=2).repeat(4, axis=3)
    for name, count in [(f"data_batch_{i}.bin", 10000) for i in range(1, 6)] + [("test_batch.bin", 10000)]:
        labels = rng.integers(0, 10, size=count, dtype=np.uint8)
        noise = rng.integers(-40, 41, size=(count, 3, 32, 32))
        pixels = np.clip(patterns[labels] + noise, 0, 255).astype(np.uint8).reshape(count, 3072)
        records = np.concatenate([labels[:, None], pixels], axis=1)
        records.tofile(os.path.join(out, name))
    print(f"wrote 50000 + 10000 CIFAR-10 records to {out}")


if __name__ == "__main__":
    main()
