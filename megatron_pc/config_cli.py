"""``megatron-pc config [CONFIG] [overrides]``: print the resolved, validated configuration."""

from __future__ import annotations

import argparse

import yaml

from megatron_pc.config import DEFAULTS, load_config, to_dict
from megatron_pc.data.config import BUILTIN_PREFIX, check_files

OWN_DATA_NOTE = (f"no CONFIG given: with your own data.source the run takes the dataclass defaults, a real GPU run's "
                 "(the Qwen3-4B recipe on one GPU: 2048-token prompts, 4096-token responses, chat template, math_verify; "
                 "docs/config.md); name configs/tiny_cpu.yaml for the tiny CPU run's values")
"""What a command says when it takes the defaults because the user named their own data."""


def resolve_config_args(config: str | None, overrides: list[str]) -> tuple[str | None, list[str], str | None]:
    """The CONFIG to load, the overrides, and a note to show (or None).

    CONFIG may be omitted: a first argument with ``=`` is an override. With no CONFIG the
    command runs the tiny CPU run (configs/tiny_cpu.yaml), unless the overrides name a data
    file of the user's own (``data.source=my.parquet``): such a run is a real one, so it takes
    the dataclass defaults (a real GPU run's) and says so.
    """
    if config and "=" in config:
        config, overrides = None, [config, *overrides]
    overrides = list(overrides)
    if config is None and any(_own_data(item) for item in overrides):
        return DEFAULTS, overrides, OWN_DATA_NOTE
    return config, overrides, None


def split_config_args(config: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """:func:`resolve_config_args` without the note."""
    path, overrides, _ = resolve_config_args(config, overrides)
    return path, overrides


def _own_data(override: str) -> bool:
    key, _, value = override.partition("=")
    return key.strip() == "data.source" and not value.strip().startswith(BUILTIN_PREFIX)


def main(argv: list[str] | None = None) -> int:
    """Print the configuration as YAML."""
    parser = argparse.ArgumentParser(prog="megatron-pc config", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("config", nargs="?", help="experiment YAML or a name in configs/ (qwen3_14b); "
                        f"default: the tiny CPU run (configs/tiny_cpu.yaml); {DEFAULTS}: the dataclass defaults")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. allocation.train_batch=64")
    parser.add_argument("--no-data-check", action="store_true", help="do not check that the data files exist")
    args = parser.parse_intermixed_args(argv)
    path, overrides, note = resolve_config_args(args.config, args.overrides)
    cfg = load_config(path, overrides)
    if not args.no_data_check:
        check_files(cfg.data)
    if note:
        print(f"# {note}")
    print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0
