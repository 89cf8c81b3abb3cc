"""Validation on each held-out set: accuracy (sampled and greedy), mean@n, pass@k, maj@k, and
every answer written to ``validation/step_<N>_<set>.jsonl`` in the run directory."""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from megatron_pc.driver.prepare import ValidationData
from megatron_pc.driver.scoring import Grading, decode_and_score, grading_of
from megatron_pc.console import CONSOLE
from megatron_pc.config import Config
from megatron_pc.data.loading import DEFAULT_VALIDATION_NAME
from megatron_pc.data.records import PromptRecord
from megatron_pc.metrics.at_k import at_k_metrics
from megatron_pc.reward.extract import extract_answer
from megatron_pc.reward.pool import RewardPool, RewardResult
from megatron_pc.rollout.base import GenerationRequest, SamplingSettings, derive_seed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SetPlan:
    """How one validation set is evaluated: its prompts and the sampled pass's settings."""

    name: str
    tokens: list[list[int]]
    records: list[PromptRecord]
    n: int
    sampling: SamplingSettings

    @property
    def gradings(self) -> list[Grading]:
        """What each prompt is graded against."""
        return [grading_of(r) for r in self.records]


@dataclass(frozen=True)
class SetScore:
    """Validation figures of one set."""

    accuracy: float
    """Mean correctness of the sampled responses."""
    accuracy_stderr: float
    """Standard error of ``accuracy`` over prompts (see :func:`prompt_stderr`)."""
    greedy_accuracy: float | None
    """Correctness of the greedy responses; None when ``training.val_greedy`` is off."""
    reward_mean: float
    """Mean reward of the sampled responses."""
    at_k: dict[str, float]
    """mean@n, pass@k, maj@k of the sampled responses (metrics/at_k.py)."""


def prompt_stderr(per_prompt: list[float]) -> float:
    """Standard error of the mean of per-prompt accuracies: sample std / sqrt(prompts).

    Taken over prompts rather than samples (sqrt(p(1-p)/samples)) because samples of one
    prompt are correlated; with one sample per prompt the two agree. NaN for one prompt.
    """
    if len(per_prompt) < 2:
        return math.nan
    mean = sum(per_prompt) / len(per_prompt)
    var = sum((x - mean) ** 2 for x in per_prompt) / (len(per_prompt) - 1)
    return math.sqrt(var / len(per_prompt))


def plan_sets(cfg: Config, data: Any) -> list[SetPlan]:
    """One plan per validation set of ``data`` (a RunData), sampling resolved against the run.

    With ``data.validation`` None or one file, the single set keeps the historical seed
    ``derive_seed(seed, "validation")``; sets of a list are seeded by their name too, so adding
    or reordering sets leaves each set's samples unchanged.
    """
    base = SamplingSettings.from_config(cfg.rollout)
    listed = {s.name: s for s in cfg.data.validation} if isinstance(cfg.data.validation, list) else {}
    sets = data.val_sets or [ValidationData(DEFAULT_VALIDATION_NAME, data.val, data.val_tokens)]
    plans = []
    for vs in sets:
        spec = listed.get(vs.name)
        n, temperature, top_p = (spec.n, spec.temperature, spec.top_p) if spec is not None else (None, None, None)
        sampling = replace(
            base,
            temperature=_or(temperature, base.temperature),
            top_p=_or(top_p, base.top_p),
            seed=derive_seed(cfg.seed, "validation", vs.name) if listed else derive_seed(cfg.seed, "validation"),
        )
        plans.append(SetPlan(vs.name, vs.tokens, vs.records, _or(n, cfg.training.val_samples), sampling))
    return plans


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


@dataclass(frozen=True)
class Answer:
    """One validation response with its reward."""

    text: str
    result: RewardResult


class Evaluator:
    """Validation on every set: ``n`` sampled responses per prompt (the set's n, temperature and
    top_p, defaulting to ``training.val_samples`` and the rollout's) with a fixed seed, so
    evaluations differ only by the policy, and one greedy response (``training.val_greedy``).

    Metrics: ``val_accuracy``, ``val_accuracy_stderr``, ``val_greedy_accuracy``,
    ``val_reward_mean``: the unweighted mean over the sets (the set's own values for one set);
    the stderr combines the sets' as independent: sqrt(sum se_i^2) / sets. When
    ``data.validation`` is a list, also ``val/<name>/accuracy``, ``.../accuracy_stderr``,
    ``.../greedy_accuracy``, ``.../reward_mean`` per set. For every set, by its name
    (``validation`` for a set split off the training source): ``val/<name>/mean@n``,
    ``pass@k``, ``maj@k`` (docs/metrics.md).

    With ``answers_dir``, every answer goes to ``<answers_dir>/step_<N>_<set>.jsonl``; the
    rows of the last run are kept in :attr:`last_rows` by set (for W&B tables).
    """

    def __init__(self, cfg: Config, data: Any, engines: Any, rewards: RewardPool, answers_dir: Path | None = None) -> None:
        self.cfg, self.data, self.engines, self.rewards = cfg, data, engines, rewards
        self.plans = plan_sets(cfg, data)
        self.per_set = isinstance(cfg.data.validation, list)
        self.answers_dir = answers_dir
        self.last_rows: dict[str, list[dict[str, Any]]] = {}

    def _generate(self, plan: SetPlan, n: int, sampling: SamplingSettings) -> list[list[Answer]]:
        """Each sample's text and reward, grouped by prompt (decoded once)."""
        out = self.engines.generate([GenerationRequest(tuple(t), n) for t in plan.tokens], sampling)
        gradings = [g for g in plan.gradings for _ in range(n)]
        texts, results = decode_and_score(self.data.tokenizer, out, gradings, self.rewards)
        answers = [Answer(t, r) for t, r in zip(texts, results)]
        return [answers[i : i + n] for i in range(0, len(answers), n)]

    def score(self, plan: SetPlan, step: int = 0) -> SetScore:
        """Sampled and greedy figures of one set under the current policy (its answers written
        when there is an ``answers_dir``)."""
        sampled = self._generate(plan, plan.n, plan.sampling)
        with_greedy = self.cfg.training.val_greedy
        greedy = self._generate(plan, 1, replace(plan.sampling, temperature=0.0, seed=None)) if with_greedy else [[] for _ in sampled]
        per_prompt = [sum(a.result.correct for a in group) / len(group) for group in sampled]
        flat = [a.result for group in sampled for a in group]
        self.last_rows[plan.name] = rows = answer_rows(step, plan, sampled, greedy)
        if self.answers_dir is not None:
            write_jsonl_atomic(self.answers_dir / f"step_{step}_{plan.name}.jsonl", rows)
        return SetScore(
            accuracy=sum(r.correct for r in flat) / len(flat),
            accuracy_stderr=prompt_stderr(per_prompt),
            greedy_accuracy=sum(a.result.correct for group in greedy for a in group) / len(greedy) if with_greedy else None,
            reward_mean=sum(r.reward for r in flat) / len(flat),
            at_k=at_k_metrics([[a.result.reward for a in g] for g in sampled], [[a.result.correct for a in g] for g in sampled],
                              [[extract_answer(a.text) for a in g] for g in sampled]),  # fmt: skip
        )

    def run(self, step: int) -> dict[str, float]:
        """Validation metrics of the current policy."""
        scores = {plan.name: self.score(plan, step) for plan in self.plans}
        metrics = summarize(scores, per_set=self.per_set)
        detail = "".join(f"; {name}: {s.accuracy:.3f}{_greedy_text(s.greedy_accuracy, ' (greedy {:.3f})')}" for name, s in scores.items()) if self.per_set else ""
        logger.info(
            "step %d validation: sampled accuracy %.3f +- %.3f%s%s",
            step, metrics["val_accuracy"], metrics["val_accuracy_stderr"], _greedy_text(metrics.get("val_greedy_accuracy"), ", greedy {:.3f}"), detail,
            extra=CONSOLE,
        )
        return metrics


def _greedy_text(value: float | None, form: str) -> str:
    return "" if value is None else form.format(value)


def answer_rows(step: int, plan: SetPlan, sampled: list[list[Answer]], greedy: list[list[Answer]]) -> list[dict[str, Any]]:
    """One row per answer: the prompt (as in the data), its id, the sample's index (``greedy``
    for the greedy one), the response, its reward, success, extracted answer, the reference."""
    rows = []
    for record, samples, best in zip(plan.records, sampled, greedy):
        prompt = record.to_row()["prompt"]
        for index, a in [*enumerate(samples), *(("greedy", b) for b in best)]:
            rows.append({"step": step, "set": plan.name, "prompt_id": record.id, "sample": index, "prompt": prompt,
                         "response": a.text, "reward": a.result.reward, "correct": a.result.correct,
                         "extracted": extract_answer(a.text), "answer": record.answer})  # fmt: skip
    return rows


def write_jsonl_atomic(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` as JSON lines through a temporary file, so a crash never leaves half a file
    (a resumed run that validates the same step again replaces it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    os.replace(tmp, path)


def summarize(scores: dict[str, SetScore], per_set: bool) -> dict[str, float]:
    """The metrics of :class:`Evaluator` from each set's score (in set order)."""
    metrics: dict[str, float] = {}
    for name, s in scores.items():
        if per_set:
            metrics |= {
                f"val/{name}/accuracy": s.accuracy, f"val/{name}/accuracy_stderr": s.accuracy_stderr,
                f"val/{name}/reward_mean": s.reward_mean,
            }
            if s.greedy_accuracy is not None:
                metrics[f"val/{name}/greedy_accuracy"] = s.greedy_accuracy
        metrics |= {f"val/{name}/{key}": value for key, value in s.at_k.items()}
    k = len(scores)
    values = list(scores.values())
    metrics["val_accuracy"] = sum(s.accuracy for s in values) / k
    metrics["val_accuracy_stderr"] = math.sqrt(sum(s.accuracy_stderr**2 for s in values)) / k
    if all(s.greedy_accuracy is not None for s in values):
        metrics["val_greedy_accuracy"] = sum(s.greedy_accuracy for s in values) / k  # type: ignore[misc]
    metrics["val_reward_mean"] = sum(s.reward_mean for s in values) / k
    return metrics
