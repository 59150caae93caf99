#!/usr/bin/env python3
"""`trainer export` of every shipped model family, checked by ONNX and run by ONNX Runtime (ctest
onnx_export). Run by scripts/onnx_export_check.sh, which finds node's onnxruntime-node.

For each family a small model (synthetic images, a few SGD steps so BatchNorm's statistics and every
weight move off their initial values) is trained; `trainer eval --dump-logits` writes a batch and the
logits; `trainer export` writes the ONNX file, fp32 and fp16; then
  - onnx.checker.check_model(full_check=True) (python3-onnx; skipped without it),
  - ONNX Runtime on the dump's batch (scripts/onnx_runtime_check.js): fp32 logits within 1e-4
    relative and the same top-1 for every image; fp16 within 2e-2 relative, top-1 allowed to differ
    on at most 2 of the batch's images (float16 rounding can swap near-ties).
  onnx_export_check.py TRAINER NODE_MODULES WORKDIR [FAMILY ...]
"""
import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# name -> (model keys, image size, channels, steps). Small sizes where the config allows them.
FAMILIES = {
    "mlp": ({"name": "mlp"}, 28, 1, 3),
    "cnn": ({"name": "cnn"}, 28, 1, 3),
    "resnet18": ({"name": "resnet18", "width": 8}, 32, 3, 3),  # cifar stem (auto at 32)
    "resnet34": ({"name": "resnet34", "width": 8, "stem": "imagenet"}, 32, 3, 3),
    "resnet50": ({"name": "resnet50", "width": 8}, 32, 3, 3),
    "vit": ({"name": "vit", "patch_size": 4, "depth": 2, "heads": 2, "width": 32, "mlp_dim": 64}, 28, 1, 3),
    "vit_s_16": ({"name": "vit_s_16"}, 32, 3, 1),
    "vit_b_16": ({"name": "vit_b_16"}, 32, 3, 1),
    "convnext": ({"name": "convnext", "depths": [1, 1, 2, 1], "widths": [16, 32, 48, 64]}, 28, 1, 3),
    "convnext_tiny": ({"name": "convnext_tiny"}, 32, 3, 1),
}


def toml_value(v):
    if isinstance(v, str):
        return '"%s"' % v
    if isinstance(v, list):
        return "[%s]" % ", ".join(str(x) for x in v)
    return str(v)


def write_config(path, model, size, channels, steps, run_dir):
    model = dict(model, in_channels=channels)
    lines = ["[model]"] + ["%s = %s" % (k, toml_value(v)) for k, v in model.items()]
    lines += ["[data]", 'dataset = "synthetic"', "synthetic_samples = 160", "synthetic_image_size = %d" % size,
              "synthetic_classes = 10", "batch_size = 16", "eval_batch_size = 32", "workers = 1"]
    lines += ["[train]", 'device = "cpu"', "epochs = 1", "max_steps = %d" % steps, 'run_dir = "%s"' % run_dir]
    lines += ["[optim]", 'name = "sgd"', "lr = 0.05", "momentum = 0.9", "[metrics]", "port = 0"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def weights_transform(weights):
    with open(weights, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return header["__metadata__"]["trainer.eval_transform"]


def onnx_python():
    """An interpreter with python3-onnx: PATH's python3, else Debian's (a pyenv shim may shadow it)."""
    for python in ("python3", "/usr/bin/python3"):
        try:
            if subprocess.run([python, "-c", "import onnx"], capture_output=True).returncode == 0:
                return python
        except OSError:
            pass
    return None


def run(cmd, **kw):
    result = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s%s" % (" ".join(cmd), result.returncode, result.stdout, result.stderr))
    return result.stdout


def check_family(name, trainer, node_modules, work, checker):
    model, size, channels, steps = FAMILIES[name]
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    config = os.path.join(d, "config.toml")
    write_config(config, model, size, channels, steps, os.path.join(d, "run"))
    run([trainer, "train", config])
    weights = os.path.join(d, "run", "checkpoints", "final.safetensors")
    dump = os.path.join(d, "logits.safetensors")
    run([trainer, "eval", config, "--weights", weights, "--dump-logits", dump])
    transform = weights_transform(weights)
    env = dict(os.environ, NODE_PATH=node_modules)
    for precision, tolerance, flags in (("fp32", "1e-4", []), ("fp16", "2e-2", ["--fp16"])):
        model_path = os.path.join(d, "%s-%s.onnx" % (name, precision))
        print(run([trainer, "export", config, "--weights", weights, "--out", model_path] + flags).strip())
        if checker:
            run([checker, "-c", "import onnx, sys; onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)",
                 model_path])
            print("  onnx.checker: ok")
        allowed = "0" if precision == "fp32" else "2"
        print("  " + run(["node", os.path.join(HERE, "onnx_runtime_check.js"), model_path, dump, transform,
                          tolerance, allowed], env=env).strip())


def main():
    trainer, node_modules, work = sys.argv[1:4]
    families = sys.argv[4:] or list(FAMILIES)
    checker = onnx_python()
    if not checker:
        print("onnx_export: python3-onnx not found: onnx.checker skipped (apt-get install python3-onnx)")
    failed = []
    for name in families:
        try:
            check_family(name, trainer, node_modules, work, checker)
        except RuntimeError as e:
            print("FAIL %s: %s" % (name, e))
            failed.append(name)
    print("onnx_export: %d of %d families pass%s" % (len(families) - len(failed), len(families),
                                                    (": failed " + ", ".join(failed)) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
