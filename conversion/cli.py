"""``megatron-pc convert hf-to-megatron|megatron-to-hf ...``: the two converters as subcommands."""

from __future__ import annotations

import argparse

from conversion import hf_to_megatron, megatron_to_hf


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run one converter; returns the exit code (2 on a user error)."""
    parser = argparse.ArgumentParser(prog="megatron-pc convert", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, module in (("hf-to-megatron", hf_to_megatron), ("megatron-to-hf", megatron_to_hf)):
        sub = commands.add_parser(name, help=module.__doc__.strip().splitlines()[0])
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    args = parser.parse_args(argv)
    return int(args.run(args))
