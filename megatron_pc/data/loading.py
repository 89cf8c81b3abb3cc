"""load_prompts: train and validation prompts for a DataConfig, deterministic for a seed."""

from __future__ import annotations

import logging
import random

from megatron_pc.data.builtin import BUILTIN_SOURCES
from megatron_pc.data.config import BUILTIN_PREFIX, DataConfig
from megatron_pc.data.records import PromptRecord, read_prompts
from megatron_pc.errors import DataError

__all__ = ["load_prompts", "split_prompts"]

logger = logging.getLogger(__name__)


def load_prompts(cfg: DataConfig, seed: int) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """(train, validation) records. No id and no prompt text appears in both.

    Builtin source: ``train_size + validation_size`` distinct prompts drawn with ``seed`` and
    split by ``seed``. File source: all its rows are the pool, ``validation_size`` of them split
    off by ``seed``. With ``cfg.validation`` (a file), that file is the validation set and train
    records that repeat one of its ids or prompts are dropped (logged).
    """
    explicit_validation = read_prompts(cfg.validation) if cfg.validation is not None else None
    if cfg.source.startswith(BUILTIN_PREFIX):
        generate = BUILTIN_SOURCES[cfg.source[len(BUILTIN_PREFIX):]]
        extra = 0 if explicit_validation is not None else cfg.validation_size
        pool = generate(cfg.train_size + extra, seed)
        if len(pool) < cfg.train_size + extra:
            raise DataError(f"{cfg.source}: generated only {len(pool)} distinct prompts, need {cfg.train_size + extra}")
    else:
        pool = read_prompts(cfg.source)
    if explicit_validation is not None:
        return _without(pool, explicit_validation, cfg.source), explicit_validation
    return split_prompts(pool, cfg.validation_size, seed)


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
