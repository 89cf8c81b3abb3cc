"""Builtin prompt sources by exact name: generated, seeded, no files needed."""

from __future__ import annotations

import hashlib
from functools import partial
from typing import Callable

from megatron_pc.data.arithmetic import MIXES, arithmetic_prompts, mix_prompts
from megatron_pc.data.questions import arithmetic_question_prompts
from megatron_pc.data.records import PromptRecord

__all__ = ["BUILTIN_SOURCES", "gsm_symbolic_prompts"]


def gsm_symbolic_prompts(size: int, seed: int) -> list[PromptRecord]:
    """``size`` distinct GSM8K-derived word problems from reasoning-gym's ``gsm_symbolic``."""
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError("builtin:gsm_symbolic needs 'reasoning-gym' (pip install megatron-pc[cpu])") from None
    # Drawn with headroom so that dropping repeated questions still leaves ``size``.
    records: dict[str, PromptRecord] = {}
    for item in reasoning_gym.create_dataset("gsm_symbolic", seed=seed, size=size + size // 4 + 8):
        question = item["question"]
        # The id is a hash of the text: equal questions get equal ids and collapse here.
        rid = "gsm_symbolic/" + hashlib.sha1(question.encode()).hexdigest()[:16]
        difficulty = item.get("metadata", {}).get("difficulty")
        difficulty = float(difficulty) if isinstance(difficulty, (int, float)) else None
        records.setdefault(rid, PromptRecord(rid, question, str(item["answer"]), "gsm_symbolic", difficulty))
        if len(records) == size:
            break
    return list(records.values())


BUILTIN_SOURCES: dict[str, Callable[[int, int], list[PromptRecord]]] = {
    "arithmetic": arithmetic_prompts,
    "gsm_symbolic": gsm_symbolic_prompts,
    "arithmetic_questions": arithmetic_question_prompts,  # for SmolLM2 (configs/smollm2_135m_cpu.yaml)
    # The benchmark's task regimes: fixed mixes of operations and operand sizes.
    **{name: partial(mix_prompts, mix) for name, mix in MIXES.items()},
}
"""Generators ``(size, seed) -> distinct records`` for ``DataConfig.source = "builtin:<name>"``."""
