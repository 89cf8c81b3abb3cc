"""``megatron-pc convert hf-to-megatron|megatron-to-hf ...``: the two converters as subcommands."""

from __future__ import annotations

import argparse

from conversion import hf_to_megatron, megatron_to_hf


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run one converter; returns the exit code (2 on a user error)."""
    parser = argparse.ArgumentParser(prog="megatron-pc convert", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (hf_to_megatron.COMMAND, megatron_to_hf.COMMAND):
        sub = commands.add_parser(command.name, help=command.summary)
        command.add_arguments(sub)
        sub.set_defaults(run=command.run)
    args = parser.parse_args(argv)
    return int(args.run(args))
