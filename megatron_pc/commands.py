"""A table of subcommands imported lazily: the one dispatch mechanism of ``megatron-pc`` and of
``megatron-pc bench``. An entry names ``module:function`` (the function takes the remaining
argv and returns an exit code) and a line of help; the module is imported only when its
command runs, so ``megatron-pc simulate`` starts without torch or vLLM."""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CommandTable:
    """Named subcommands of one program."""

    prog: str
    """The program as typed (``megatron-pc``, ``megatron-pc bench``)."""
    commands: dict[str, tuple[str, str]]
    """name -> (``module:function``, one-line help)."""
    metavar: str = "COMMAND"
    heading: str = "commands"
    footer: str = ""
    """A closing line of the usage (empty: none)."""

    def usage(self) -> str:
        """The usage text: one line per command with its help."""
        width = max(map(len, self.commands))
        lines = [f"usage: {self.prog} {self.metavar} [ARGS...]", "", f"{self.heading}:"]
        lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in self.commands.items()]
        return "\n".join(lines + (["", self.footer] if self.footer else []))

    def function(self, name: str) -> Callable[[list[str]], int | None]:
        """The function of command ``name`` (its module imported now)."""
        module_name, func_name = self.commands[name][0].split(":")
        return getattr(importlib.import_module(module_name), func_name)

    def dispatch(self, argv: list[str], before: Callable[[], None] | None = None) -> int:
        """Run the command ``argv[0]`` on the rest; ``-h`` prints the usage (exit 0), no command
        or an unknown one prints it too (exit 2). ``before`` runs just before a found command."""
        if not argv or argv[0] in ("-h", "--help"):
            print(self.usage())
            return 0 if argv else 2
        name, rest = argv[0], argv[1:]
        if name not in self.commands:
            close = difflib.get_close_matches(name, list(self.commands), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            print(f"{self.prog}: unknown {self.metavar.lower()} {name!r}{hint}\n\n{self.usage()}", file=sys.stderr)
            return 2
        if before is not None:
            before()
        return int(self.function(name)(rest) or 0)
