"""``megatron-pc config [CONFIG] [overrides]``: print the resolved, validated configuration."""

from __future__ import annotations

import argparse

import yaml

from megatron_pc.config import load_config, to_dict


def split_config_args(config: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """Let the CONFIG argument be omitted: a first argument with ``=`` is an override."""
    if config and "=" in config:
        return None, [config, *overrides]
    return config, list(overrides)


def main(argv: list[str] | None = None) -> int:
    """Print the configuration as YAML."""
    parser = argparse.ArgumentParser(prog="megatron-pc config", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("config", nargs="?", help="experiment YAML; default: the embedded tiny CPU configuration")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. allocation.train_batch=64")
    args = parser.parse_args(argv)
    path, overrides = split_config_args(args.config, args.overrides)
    print(yaml.safe_dump(to_dict(load_config(path, overrides)), sort_keys=False), end="")
    return 0
