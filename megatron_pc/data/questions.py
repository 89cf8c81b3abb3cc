"""Arithmetic written as questions with a boxed answer, for small instruction-tuned models.

``What is 7 * 8? Put the final answer in \\boxed{}.`` with answer ``56``, graded by math-verify.
The mix is what SmolLM2-135M-Instruct partly solves (measured at the start, 8 samples at
temperature 1, 200 tokens, 6 prompts a cell): single-digit sums p 0.25 (z 0.0), single-digit
products p 0.25 (z 0.33), two-digit plus one-digit sums p 0.04 (z 0.67); two-digit sums and
beyond are never solved. configs/smollm2_135m_cpu.yaml trains on it.
"""

from __future__ import annotations

import random

from megatron_pc.data.records import PromptRecord
from megatron_pc.errors import DataError

__all__ = ["arithmetic_question_prompts"]

# (operation, digits of a, digits of b, weight)
_CELLS = (("+", 1, 1, 0.45), ("*", 1, 1, 0.35), ("+", 2, 1, 0.20))


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def arithmetic_question_prompts(size: int, seed: int) -> list[PromptRecord]:
    """``size`` distinct questions, deterministic for a seed (about 1,100 exist)."""
    rng = random.Random(seed)
    records: dict[str, PromptRecord] = {}
    weights = [c[3] for c in _CELLS]
    for _ in range(50 * size + 1000):
        if len(records) == size:
            return list(records.values())
        op, da, db, _ = rng.choices(_CELLS, weights)[0]
        a, b = _number(rng, da), _number(rng, db)
        value = a + b if op == "+" else a * b
        question = f"What is {a} {op} {b}? Put the final answer in \\boxed{{}}."
        key = f"arithmetic_questions/{a}{op}{b}"
        records.setdefault(key, PromptRecord(key, question, str(value), "arithmetic_questions", float(da + db)))
    raise DataError(f"builtin:arithmetic_questions: could not draw {size} distinct questions (about 1,100 exist)")
