#!/usr/bin/env python3
"""`trainer predict` against `trainer eval` on the same Fashion-MNIST test images (ctest predict_fashion_mnist).

Writes the first 256 test images as 8-bit grey PNGs (Python's zlib: no imaging module needed) into a
directory, adds a corrupt file (a PNG cut in half) and a text file named .png, then runs
  trainer eval CONFIG --weights W --dump-logits D       (the first 256 test images' logits)
  trainer predict CONFIG --weights W --format csv DIR   (the same images from the PNG files)
and requires: every good image gets the top-1 class eval's logits give (argmax, lowest index on ties),
the two bad files are reported with an error and the others still classified, exit status 1 (a file
failed), and the class names stored with the weights.
  predict_check.py TRAINER CONFIG WEIGHTS WORKDIR
"""
import csv
import gzip
import io
import json
import os
import struct
import subprocess
import sys
import zlib

COUNT = 256


def png_grey(pixels, width, height):
    rows = b"".join(b"\x00" + pixels[y * width:(y + 1) * width] for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def test_images(root="/usr/share/datasets/fashion-mnist"):
    with gzip.open(os.path.join(root, "t10k-images-idx3-ubyte.gz")) as f:
        data = f.read()
    _, n, h, w = struct.unpack(">IIII", data[:16])
    return [data[16 + i * h * w:16 + (i + 1) * h * w] for i in range(min(n, COUNT))], h, w


def read_logits(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    info = json.loads(data[8:8 + n])["logits"]
    rows, classes = info["shape"]
    begin, end = info["data_offsets"]
    values = struct.unpack("<%df" % (rows * classes), data[8 + n + begin:8 + n + end])
    return [values[r * classes:(r + 1) * classes] for r in range(rows)]


def argmax(row):
    return max(range(len(row)), key=lambda c: (row[c], -c))


def main():
    trainer, config, weights, work = sys.argv[1:5]
    images_dir = os.path.join(work, "images")
    os.makedirs(images_dir, exist_ok=True)
    images, h, w = test_images()
    for i, pixels in enumerate(images):
        with open(os.path.join(images_dir, "%04d.png" % i), "wb") as f:
            f.write(png_grey(pixels, w, h))
    good = open(os.path.join(images_dir, "0000.png"), "rb").read()
    with open(os.path.join(images_dir, "0100-cut.png"), "wb") as f:
        f.write(good[:len(good) // 2])
    with open(os.path.join(images_dir, "0200-text.png"), "wb") as f:
        f.write(b"not an image\n")

    dump = os.path.join(work, "logits.safetensors")
    subprocess.run([trainer, "eval", config, "--weights", weights, "--dump-logits", dump], check=True,
                   stdout=subprocess.DEVNULL)
    expected = [argmax(row) for row in read_logits(dump)]

    run = subprocess.run([trainer, "predict", config, "--weights", weights, "--format", "csv", "--topk", "3",
                          images_dir], capture_output=True, text=True)
    sys.stderr.write(run.stderr)
    rows = list(csv.DictReader(io.StringIO(run.stdout)))
    top1 = {r["path"]: r for r in rows if r["rank"] == "1"}
    errors = {r["path"]: r["error"] for r in rows if r["error"]}
    failures = []
    if run.returncode != 1:
        failures.append("exit status %d, expected 1 (two files are bad)" % run.returncode)
    for bad in ("0100-cut.png", "0200-text.png"):
        path = os.path.join(images_dir, bad)
        if path not in errors:
            failures.append("%s: no error reported" % bad)
        if "warning: " + path not in run.stderr:
            failures.append("%s: no warning on stderr" % bad)
    names = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
             "Ankle boot"]
    for i, want in enumerate(expected):
        row = top1.get(os.path.join(images_dir, "%04d.png" % i))
        if row is None:
            failures.append("image %d: not classified" % i)
        elif int(row["index"]) != want or row["class"] != names[want]:
            failures.append("image %d: predict says %s (%s), eval's logits %d" % (i, row["index"], row["class"], want))
    print("predict_check: %d images, %d agree with eval's top-1, %d bad files reported" %
          (len(expected), sum(1 for i, want in enumerate(expected)
                              if top1.get(os.path.join(images_dir, "%04d.png" % i), {}).get("index") == str(want)),
           len(errors)))
    for f in failures[:20]:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
