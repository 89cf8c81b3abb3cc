"""What both converters' command lines share: parse the options, convert, and print one line
(the output written, or the user error with exit code 2). ``megatron-pc convert NAME`` and
``python -m conversion.NAME`` both run a converter through its :class:`Command`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from megatron_pc.errors import MegatronPCError


@dataclass(frozen=True)
class Command:
    """One converter as a command line."""

    name: str
    """Its subcommand name (``hf-to-megatron``); ``python -m`` shows it with underscores."""
    summary: str
    """One line of help."""
    add_arguments: Callable[[argparse.ArgumentParser], None]
    """Adds its options to a parser."""
    convert: Callable[[argparse.Namespace], Path]
    """Converts from parsed options; returns the directory written."""
    wrote: str
    """What the output is, for the closing line (``Megatron checkpoint``)."""

    def run(self, args: argparse.Namespace) -> int:
        """Run parsed options; a user error prints one line and returns 2."""
        try:
            out = self.convert(args)
        except MegatronPCError as err:
            print(f"{self.name}: error: {err}", file=sys.stderr)
            return 2
        print(f"wrote {self.wrote} {out}")
        return 0

    def main(self, argv: list[str] | None = None) -> int:
        """``python -m conversion.<name>``: parse ``argv``, log to stderr, run."""
        parser = argparse.ArgumentParser(prog=self.name.replace("-", "_"), description=self.summary)
        self.add_arguments(parser)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return self.run(parser.parse_args(argv))
