"""load_prompts: train and validation prompts for a DataConfig, deterministic for a seed."""

from __future__ import annotations

import logging
import random
from pathlib import Path

from megatron_pc.data.builtin import BUILTIN_SOURCES
from megatron_pc.data.config import BUILTIN_PREFIX, DataConfig
from megatron_pc.data.convert import read_records
from megatron_pc.data.records import PromptRecord
from megatron_pc.errors import DataError

__all__ = ["DEFAULT_VALIDATION_NAME", "load_prompt_sets", "load_prompts", "split_prompts"]

logger = logging.getLogger(__name__)

DEFAULT_VALIDATION_NAME = "validation"
"""Name of the one validation set when ``data.validation`` is None (split off the source)."""


def load_prompts(cfg: DataConfig, seed: int) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """(train, validation) records; with several validation sets, validation is their
    concatenation in config order. No id and no prompt text appears in train and validation.

    See :func:`load_prompt_sets` for how the sets are made.
    """
    train, sets = load_prompt_sets(cfg, seed)
    return train, [r for records in sets.values() for r in records]


def load_prompt_sets(cfg: DataConfig, seed: int) -> tuple[list[PromptRecord], dict[str, list[PromptRecord]]]:
    """Train records and the validation sets by name, in config order.

    Builtin source: ``train_size + validation_size`` distinct prompts drawn with ``seed`` and
    split by ``seed``. File source: all its rows are the pool, ``validation_size`` of them split
    off by ``seed``. Either way the split-off set is named :data:`DEFAULT_VALIDATION_NAME`.
    With ``cfg.validation`` (a file, or a list of sets) every file is read, the sets are named
    by the file stem (or their ``name``), and train records that repeat an id or a prompt of
    ANY set are dropped (logged).
    """
    explicit = _read_validation(cfg)
    if cfg.source.startswith(BUILTIN_PREFIX):
        generate = BUILTIN_SOURCES[cfg.source[len(BUILTIN_PREFIX):]]
        extra = 0 if explicit is not None else cfg.validation_size
        pool = generate(cfg.train_size + extra, seed)
        if len(pool) < cfg.train_size + extra:
            raise DataError(f"{cfg.source}: generated only {len(pool)} distinct prompts, need {cfg.train_size + extra}")
    else:
        pool = read_records(cfg.source, cfg.format)
    if explicit is not None:
        return _without(pool, [r for records in explicit.values() for r in records], cfg.source), explicit
    train, validation = split_prompts(pool, cfg.validation_size, seed)
    return train, {DEFAULT_VALIDATION_NAME: validation}


def _read_validation(cfg: DataConfig) -> dict[str, list[PromptRecord]] | None:
    """The validation files of ``cfg`` by set name, or None when validation is split off."""
    if cfg.validation is None:
        return None
    if isinstance(cfg.validation, str):
        return {Path(cfg.validation).stem: read_records(cfg.validation)}
    return {str(s.name): read_records(s.path, s.format) for s in cfg.validation}


def split_prompts(pool: list[PromptRecord], validation_size: int, seed: int) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """Split off ``validation_size`` records chosen by ``seed``; keeps the pool's order within each part."""
    if validation_size >= len(pool):
        raise DataError(f"validation_size {validation_size} leaves no training prompts out of {len(pool)}")
    # A seeded sample of positions, not a shuffle of the pool: the train order stays the file's.
    chosen = set(random.Random(seed).sample(range(len(pool)), validation_size))
    validation = [r for i, r in enumerate(pool) if i in chosen]
    train = [r for i, r in enumerate(pool) if i not in chosen]
    return _without(train, validation, "source"), validation


def _without(train: list[PromptRecord], validation: list[PromptRecord], name: str) -> list[PromptRecord]:
    """Train records minus those sharing an id or a prompt with validation."""
    ids = {r.id for r in validation}
    prompts = {r.prompt_key for r in validation}
    kept = [r for r in train if r.id not in ids and r.prompt_key not in prompts]
    if len(kept) < len(train):
        logger.warning("%s: dropped %d training prompts that also occur in validation", name, len(train) - len(kept))
    if not kept:
        raise DataError(f"{name}: no training prompts left after removing validation prompts")
    return kept
