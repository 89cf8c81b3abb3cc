"""Command-line options the benchmarks share."""

from __future__ import annotations

from collections.abc import Iterable

from megatron_pc.errors import MegatronPCError


def parse_names(text: str, option: str, known: Iterable[str], *, or_none: bool = False) -> list[str]:
    """The comma-separated names of ``--option``, each one of ``known``, in the order given.

    With ``or_none`` the word ``none`` (or nothing) means no names; without it at least one is
    needed. An unknown name is refused naming the option and the choices."""
    known = list(known)
    if or_none and text.strip() == "none":
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not (names or or_none):
        raise MegatronPCError(f"--{option}: unknown {unknown or 'none given'}; choose from {', '.join(known)}"
                              + (", or none" if or_none else ""))  # fmt: skip
    return names
