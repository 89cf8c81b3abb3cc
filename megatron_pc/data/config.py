"""Settings of the prompt data: where prompts come from and how they are shaped."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from megatron_pc.data.builtin import BUILTIN_SOURCES
from megatron_pc.data.formats import AUTO, FORMATS
from megatron_pc.errors import ConfigError
from megatron_pc.fields import from_dict

BUILTIN_PREFIX = "builtin:"
_FILE_SUFFIXES = (".jsonl", ".parquet")
# Set names become metric keys (``val/<name>/accuracy``) and must stay one path component.
_SET_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass
class ValidationSet:
    """One validation set of a list in ``data.validation``; unset sampling fields take the run's."""

    path: str
    """A .jsonl / .parquet file in our schema, verl's, or another of ``format``'s choices."""
    name: str | None = None
    """Name in the metrics (``val/<name>/accuracy``); letters, digits, ``_``, ``-``, ``.``.
    Default: the file name without its suffix."""
    n: int | None = None
    """Sampled responses per prompt; None: ``training.val_samples``."""
    temperature: float | None = None
    """Sampling temperature; None: ``rollout.temperature``."""
    top_p: float | None = None
    """Nucleus sampling threshold in (0, 1]; None: ``rollout.top_p``."""
    format: str = AUTO
    """The file's format: ``auto`` (detected from its columns), ``ours``, ``verl``, ``deepmath``,
    ``polaris``, ``aime``, ``math500`` (see docs/data.md)."""

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ConfigError("path", f"must be a .jsonl or .parquet file, got {self.path!r}")
        _check_file("path", self.path)
        _check_format("format", self.format)
        if self.name is None:
            self.name = Path(self.path).stem
            if not _SET_NAME.fullmatch(self.name):
                raise ConfigError("name", f"the file stem {self.name!r} is not a valid set name (letters, digits, _, -, .); set name explicitly")
        elif not _SET_NAME.fullmatch(self.name):
            raise ConfigError("name", f"must be made of letters, digits, '_', '-', '.', got {self.name!r}")
        if self.n is not None and self.n < 1:
            raise ConfigError("n", f"must be >= 1, got {self.n}")
        if self.temperature is not None and self.temperature < 0:
            raise ConfigError("temperature", f"must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ConfigError("top_p", f"must lie in (0, 1], got {self.top_p}")


@dataclass
class DataConfig:
    """Training and validation prompts (schema: docs/data.md)."""

    source: str = "data/polaris-53k.jsonl"
    """``builtin:<name>`` for a generated set (``arithmetic``, ``gsm_symbolic``), or a path to a
    .jsonl / .parquet file: our schema (id, prompt, answer[, source, difficulty]), verl's
    (prompt messages, reward_model.ground_truth, ...) or a public dataset's (see ``format``)."""
    format: str = AUTO
    """Format of a file ``source``: ``auto`` (detected from its columns), ``ours``, ``verl``,
    ``deepmath``, ``polaris``, ``aime``, ``math500``. A single-path ``validation`` and list
    items without their own ``format`` are detected."""
    validation: str | list[Any] | None = None
    """Validation prompts: None to split them off ``source`` by seed; a file; or a list of sets,
    each a file path or a :class:`ValidationSet` mapping (path, name, n, temperature, top_p).
    A list is turned into ``list[ValidationSet]`` here; see docs/data.md."""
    train_size: int = 2048
    """Prompts generated for a builtin training set (ignored for files)."""
    validation_size: int = 512
    """Validation prompts (generated, or split off a file source; ignored with ``validation``)."""
    max_prompt_tokens: int = 2048
    """Longest prompt in tokens (chat template included); see ``prompt_truncation``."""
    prompt_truncation: Literal["left", "error"] = "left"
    """A longer prompt: ``left`` keeps its last max_prompt_tokens tokens (the question's end
    and the generation prompt); ``error`` refuses the run, naming the prompt."""
    max_truncated_share: float = 0.05
    """Largest share of a file's prompts that may be longer than ``max_prompt_tokens``. Below it the
    run warns once per file with the count and share and truncates them (``prompt_truncation``);
    above it the run stops, naming the file: most of its prompts would lose their beginning."""
    chat_template: bool = True
    """Wrap prompts with the tokenizer's chat template."""

    def __post_init__(self) -> None:
        if not self.source:
            raise ConfigError("source", "must name a builtin set (builtin:arithmetic) or a file")
        if self.source.startswith(BUILTIN_PREFIX):
            name = self.source[len(BUILTIN_PREFIX):]
            if name not in BUILTIN_SOURCES:
                known = ", ".join(BUILTIN_PREFIX + n for n in sorted(BUILTIN_SOURCES))
                raise ConfigError("source", f"unknown builtin set {name!r}; known: {known}")
        else:
            _check_file("source", self.source, or_builtin=True)
        _check_format("format", self.format)
        if isinstance(self.validation, list):
            self.validation = _validation_sets(self.validation)
        elif self.validation is not None:
            _check_file("validation", self.validation)
        if not 0.0 <= self.max_truncated_share <= 1.0:
            raise ConfigError("max_truncated_share", f"must lie in [0, 1], got {self.max_truncated_share}")
        for name in ("train_size", "validation_size", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")


def missing_files(data: DataConfig) -> list[tuple[str, str]]:
    """(field, path) of every data file the config names that does not exist (from the directory the
    command runs in, for a relative path). Not part of validation: configs are validated on
    machines that lack the data (a login node, a test); the commands that plan or run check it."""
    named: list[tuple[str, str]] = []
    if not data.source.startswith(BUILTIN_PREFIX):
        named.append(("data.source", data.source))
    if isinstance(data.validation, str):
        named.append(("data.validation", data.validation))
    elif isinstance(data.validation, list):
        named += [(f"data.validation[{i}].path", s.path) for i, s in enumerate(data.validation)]
    return [(field, path) for field, path in named if not Path(path).is_file()]


def check_files(data: DataConfig) -> None:
    """Raise :class:`ConfigError` naming every missing data file with its field (the first field is
    the error's); nothing when all exist."""
    missing = missing_files(data)
    if missing:
        listed = "; ".join(f"{field}: {path}: no such file" for field, path in missing)
        raise ConfigError(missing[0][0], f"{len(missing)} data file(s) missing: {listed} (a relative path is read from the "
                          f"directory the command runs in, here {Path.cwd()}; --no-data-check skips this check)")


def _validation_sets(items: list[Any]) -> list[ValidationSet]:
    """Parse the list form of ``validation``: items are paths, mappings or ValidationSets.

    The items are parsed here rather than by the config loader's type union, which folds the
    errors of every union member into one message under ``validation``; here an error names
    the item's field (``validation[1].n``).
    """
    if not items:
        raise ConfigError("validation", "must list at least one set (or be null to split one off the source)")
    sets: list[ValidationSet] = []
    for i, item in enumerate(items):
        where = f"validation[{i}]"
        if isinstance(item, ValidationSet):
            sets.append(item)
        elif isinstance(item, str):
            try:
                sets.append(ValidationSet(path=item))
            except ConfigError as err:
                raise err.within(where) from None
        elif isinstance(item, dict):
            if "path" not in item:
                raise ConfigError(f"{where}.path", "is required: the .jsonl or .parquet file of the set")
            sets.append(from_dict(ValidationSet, item, where))
        else:
            raise ConfigError(where, f"must be a file path or a mapping with path, name, n, temperature, top_p; got {type(item).__name__} {item!r}")
    seen: dict[str, int] = {}
    for i, s in enumerate(sets):
        if s.name in seen:
            raise ConfigError(f"validation[{i}].name", f"{s.name!r} is already the name of validation[{seen[s.name]}]; names must be unique")
        seen[str(s.name)] = i
    return sets


def _check_file(field: str, path: str, or_builtin: bool = False) -> None:
    """Only the type is checked here: configs are validated on machines that lack the data."""
    if not path.lower().endswith(_FILE_SUFFIXES):
        alternative = " (or builtin:<name>)" if or_builtin else ""
        raise ConfigError(field, f"must be a .jsonl or .parquet file{alternative}, got {path!r}")


def _check_format(field: str, fmt: str) -> None:
    if fmt != AUTO and fmt not in FORMATS:
        raise ConfigError(field, f"unknown format {fmt!r}; known: {', '.join([AUTO, *FORMATS])}")
