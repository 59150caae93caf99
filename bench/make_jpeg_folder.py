#!/usr/bin/env python3
"""Writes a class-per-folder JPEG tree like issue 24's: photographs' size and quality (500x375,
quality 90, 4:2:0), smooth content with texture so each file is about as large as a photograph's.

    python3 bench/make_jpeg_folder.py /tmp/jpegs --train 13000 --val 500 --classes 100
"""
import argparse
import os
from multiprocessing import Pool

import numpy as np
from PIL import Image

W, H = 500, 375


def write(job):
    path, seed = job
    rng = np.random.default_rng(seed)
    # A coarse random field upsampled (smooth regions and edges) plus fine noise (texture).
    coarse = rng.integers(0, 256, size=(12, 16, 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(coarse).resize((W, H), Image.BICUBIC), dtype=np.int16)
    noise = rng.normal(0, 12, size=(H, W, 3))
    pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, quality=90, subsampling=2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--train", type=int, default=13000)
    p.add_argument("--val", type=int, default=500)
    p.add_argument("--classes", type=int, default=100)
    a = p.parse_args()
    jobs = []
    for split, count in (("train", a.train), ("val", a.val)):
        for c in range(a.classes):
            os.makedirs(os.path.join(a.root, split, f"c{c:03d}"), exist_ok=True)
        for i in range(count):
            jobs.append((os.path.join(a.root, split, f"c{i % a.classes:03d}", f"{i:06d}.jpg"),
                         i + (0 if split == "train" else 10**7)))
    with Pool() as pool:
        pool.map(write, jobs, chunksize=64)
    size = sum(os.path.getsize(j[0]) for j in jobs)
    print(f"{a.root}: {len(jobs)} JPEGs {W}x{H} q90, {size / len(jobs) / 1024:.0f} KB on average")


if __name__ == "__main__":
    main()
