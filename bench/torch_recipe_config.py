"""Reads one of the trainer's TOML configs for the PyTorch recipe scripts (bench/torch_fashion_mnist_recipe.py):
every key resolved against configs/reference.toml's defaults, --set overrides as the trainer takes them,
and a check that no key outside what the script implements leaves its default, so that a config change
the PyTorch side does not follow stops it instead of silently training another recipe.
"""
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python before 3.11: the same parser as the tomli package
    import tomli as tomllib

REFERENCE = Path(__file__).resolve().parent.parent / "configs" / "reference.toml"

# Keys that change how a run is driven, logged or stored, never what it trains (one process, one device).
NO_EFFECT = {
    "model": {"sync_bn", "bn_stats_sync"},
    "data": {"root", "workers", "prefetch_batches", "gpu_input_pipeline", "bad_samples", "cache",
             "cache_bytes", "synthetic_samples", "synthetic_image_size", "synthetic_classes"},
    "train": {"device", "deterministic", "cuda_graph", "cudnn_fusion", "cudnn_batchnorm", "log_every_steps",
              "run_dir"},
    "checkpoint": "*",
    "metrics": "*",
    "dist": "*",
}


class ConfigError(Exception):
    pass


def parse_value(text):
    """A --set value as the trainer reads it: a TOML value, or else a bare string."""
    try:
        return tomllib.loads("v = " + text)["v"]
    except tomllib.TOMLDecodeError:
        return text


def load_config(path, overrides=()):
    """The config at `path` over the reference defaults, then each "section.key=value" of overrides.
    Returns {section: {key: value}} with every key of the reference."""
    with open(REFERENCE, "rb") as f:
        config = tomllib.load(f)
    with open(path, "rb") as f:
        user = tomllib.load(f)
    settings = [(s, k, v) for s, keys in user.items() for k, v in keys.items()]
    for item in overrides:
        name, sep, value = item.partition("=")
        section, dot, key = name.partition(".")
        if not sep or not dot:
            raise ConfigError(f"--set expects section.key=value, got '{item}'")
        settings.append((section, key, parse_value(value)))
    for section, key, value in settings:
        if section not in config or key not in config[section]:
            raise ConfigError(f"unknown key {section}.{key} (not in {REFERENCE})")
        config[section][key] = value
    return config


def check_implemented(config, implemented):
    """Raises ConfigError naming every key that is neither implemented ({section: set of keys}) nor
    free of effect on the recipe, and differs from the reference default."""
    with open(REFERENCE, "rb") as f:
        defaults = tomllib.load(f)
    unimplemented = []
    for section, keys in config.items():
        ignored = NO_EFFECT.get(section, set())
        for key, value in keys.items():
            if ignored == "*" or key in ignored or key in implemented.get(section, set()):
                continue
            if value != defaults[section][key]:
                unimplemented.append(f"{section}.{key} = {value!r} (default {defaults[section][key]!r})")
    if unimplemented:
        raise ConfigError("the PyTorch recipe does not implement: " + "; ".join(unimplemented) +
                          ". HINT: implement it here, or train this config with the trainer alone")


def require(ok, key, message):
    if not ok:
        raise ConfigError(f"{key}: {message}")
