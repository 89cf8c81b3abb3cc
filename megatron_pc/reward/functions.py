"""Reward functions by exact name. Each runs inside a grading worker process (see pool.py).

A reward function maps (model response, reference answer) to a :class:`Grade`. Responses are
hostile input: functions must never evaluate them as code. ``math_verify`` therefore uses only
math-verify's LaTeX parser (a grammar-based parser); its plain-expression mode goes through
sympy's ``parse_expr``, which is built on ``eval`` and is never enabled here. Timeouts are not
handled here: the pool kills a worker that overruns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from megatron_pc.reward.extract import extract_answer

__all__ = ["Grade", "REWARD_FUNCTIONS", "MAX_ANSWER_CHARS", "grade_math_verify", "grade_exact_int"]

MAX_ANSWER_CHARS = 512
"""Extracted answers longer than this are wrong without parsing: no reference answer is that
long, and long ones are the cheap way to make a parser or sympy run for minutes."""

_INT_RE = re.compile(r"[+-]?\d{1,64}")


@dataclass(frozen=True)
class Grade:
    """Outcome of one reward function call: correct or not, and why (a short reason code).

    A custom function (reward/custom.py) gives its ``score`` and extra ``metrics`` instead, and
    the pool judges success against ``reward.success_threshold``; ``detail`` says what failed.
    """

    correct: bool
    reason: str
    score: float | None = None
    metrics: tuple[tuple[str, float], ...] = ()
    detail: str = ""


def _extracted(response: str) -> tuple[str | None, Grade | None]:
    """The extracted answer, or a failing grade when there is none or it is too long."""
    answer = extract_answer(response)
    if answer is None or not answer:
        return None, Grade(False, "no_answer")
    if len(answer) > MAX_ANSWER_CHARS:
        return None, Grade(False, "answer_too_long")
    return answer, None


def grade_math_verify(response: str, answer: str) -> Grade:
    """Mathematical equivalence of the extracted answer and the reference (0.5 == 1/2 == \\frac{1}{2})."""
    # Imported here so that the parent process (and config validation) never pays for sympy.
    from math_verify import LatexExtractionConfig, parse, verify

    predicted, failed = _extracted(response)
    if failed is not None:
        return failed
    config = [LatexExtractionConfig(boxed_match_priority=0)]
    # Timeouts off: math-verify's signal.alarm timeouts are replaced by the pool's hard kill.
    gold = parse("\\boxed{" + answer + "}", extraction_config=config, parsing_timeout=None)
    pred = parse("\\boxed{" + predicted + "}", extraction_config=config, parsing_timeout=None)
    if not gold:
        return Grade(False, "bad_reference")
    if not pred:
        return Grade(False, "unparsable")
    ok = verify(gold, pred, timeout_seconds=None)
    return Grade(ok, "correct" if ok else "incorrect")


def grade_exact_int(response: str, answer: str) -> Grade:
    """Integer equality of the extracted answer and the reference (``+7 == 7``, ``007 == 7``)."""
    predicted, failed = _extracted(response)
    if failed is not None:
        return failed
    if not _INT_RE.fullmatch(answer.strip()):
        return Grade(False, "bad_reference")
    if not _INT_RE.fullmatch(predicted):
        return Grade(False, "unparsable")
    ok = int(predicted) == int(answer.strip())
    return Grade(ok, "correct" if ok else "incorrect")


REWARD_FUNCTIONS: dict[str, Callable[[str, str], Grade]] = {
    "math_verify": grade_math_verify,
    "exact_int": grade_exact_int,
}
"""Registry of reward functions by exact name (``RewardConfig.function``)."""
