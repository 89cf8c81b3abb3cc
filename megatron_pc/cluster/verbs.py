"""Typed calls from the driver to every rank: a method of a group is the group's form of one
method of its rank, marked ``@verb(Rank.method)``.

The mark checks, when the group's class body runs (so at import), that the two have the same
name and the same parameters: names, kinds, defaults and annotations, in order. Two forms are
allowed where a group differs from one rank by construction:

- a ``scatter`` parameter takes one value per data-parallel group: ``Sequence[T]`` on the group
  where the rank takes ``T``;
- the result: rank 0's (``gather="rank0"``, the rank's return annotation), each DP group's
  (``gather="groups"``, ``list[R]`` where the rank returns ``R``), or, with ``reduce``, the
  groups' results put together by that function (its return annotation).

A renamed or re-typed rank method thus fails at import, not in the middle of a run; and
:func:`verbs_of` lists a class's verbs for the test that pairs them
(tests/unit/test_policy_group.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from megatron_pc.errors import MegatronPCError

F = TypeVar("F", bound=Callable[..., Any])
Gather = Literal["rank0", "groups"]


class VerbMismatch(MegatronPCError):
    """A group method that does not match the rank method it is the form of."""


@dataclass(frozen=True)
class Verb:
    """What ``@verb`` recorded on a group method."""

    rank_method: Callable[..., Any]
    scatter: str | None
    gather: Gather
    reduce: Callable[..., Any] | None


def _text(annotation: Any) -> str:
    """An annotation as written (a string under ``from __future__ import annotations``)."""
    if annotation is inspect.Parameter.empty:
        return "<none>"
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def mismatches(group_method: Callable[..., Any], spec: Verb) -> list[str]:
    """How ``group_method`` differs from what ``spec`` says it must be (empty: it matches)."""
    rank = spec.rank_method
    out: list[str] = []
    if group_method.__name__ != rank.__name__:
        out.append(f"named {group_method.__name__!r}, the rank's method {rank.__name__!r}")
    mine, theirs = inspect.signature(group_method), inspect.signature(rank)
    names = (list(mine.parameters), list(theirs.parameters))
    if names[0] != names[1]:
        out.append(f"parameters ({', '.join(names[0])}) against the rank's ({', '.join(names[1])})")
    else:
        for name, here in mine.parameters.items():
            there = theirs.parameters[name]
            want = f"Sequence[{_text(there.annotation)}]" if name == spec.scatter else _text(there.annotation)
            if here.kind != there.kind:
                out.append(f"parameter {name!r} is {here.kind.description}, the rank's {there.kind.description}")
            if here.default != there.default:
                out.append(f"parameter {name!r} defaults to {here.default!r}, the rank's to {there.default!r}")
            if name != "self" and _text(here.annotation) != want:
                out.append(f"parameter {name!r} is {_text(here.annotation)}, must be {want}")
    if spec.scatter is not None and spec.scatter not in mine.parameters:
        out.append(f"scatters {spec.scatter!r}, which is no parameter")
    returned = _text(theirs.return_annotation)
    if spec.reduce is not None:
        want = _text(inspect.signature(spec.reduce).return_annotation)
    else:
        want = f"list[{returned}]" if spec.gather == "groups" else returned
    if _text(mine.return_annotation) != want:
        out.append(f"returns {_text(mine.return_annotation)}, must return {want}")
    return out


def verb(rank_method: Callable[..., Any], *, scatter: str | None = None, gather: Gather = "rank0",
         reduce: Callable[..., Any] | None = None) -> Callable[[F], F]:
    """Mark a group method as the group's form of ``rank_method`` (see the module docstring);
    raises :class:`VerbMismatch` at once when they differ."""
    spec = Verb(rank_method, scatter, "groups" if reduce is not None else gather, reduce)

    def mark(group_method: F) -> F:
        wrong = mismatches(group_method, spec)
        if wrong:
            where = f"{group_method.__qualname__} (the form of {rank_method.__qualname__})"
            raise VerbMismatch(f"{where}: " + "; ".join(wrong))
        group_method.__verb__ = spec  # type: ignore[attr-defined]
        return group_method

    return mark


def verbs_of(cls: type) -> dict[str, Verb]:
    """The methods of ``cls`` marked with :func:`verb`, by name."""
    return {name: fn.__verb__ for name, fn in vars(cls).items() if callable(fn) and hasattr(fn, "__verb__")}
