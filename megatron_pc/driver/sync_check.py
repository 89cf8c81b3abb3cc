"""The judgement of the sync check: after a weight push every engine scores a few sequences of
the step, and the mean |engine - trainer| log-prob gap of each engine is compared with
thresholds that depend on the precision of the pair (``rollout.logprob_gap_*``).

A gap over the warning threshold is logged with its figure: bf16 kernels legitimately differ.
A clear break stops the run naming the engine: one gap over ``logprob_gap_break``, or
``logprob_gap_strikes`` checks in a row over 10 x the warning threshold, or a gap that is not a
number.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from megatron_pc.allocation import StepResult, TrainGroup
from megatron_pc.console import CONSOLE
from megatron_pc.driver.update import PolicyGroup, groups_to_sequences
from megatron_pc.errors import MegatronPCError
from megatron_pc.rollout.config import LOGPROB_GAP_FAR, RolloutConfig
from megatron_pc.training.payload import as_payload

logger = logging.getLogger(__name__)


def pair_precision(params_dtype: str, engine_dtype: str, use_gpu: bool, model_path: str) -> str:
    """``fp32`` when the trainer (``model.params_dtype``; auto: fp32 on CPU, bf16 on GPU) and the
    engine (``rollout.dtype``; auto: the checkpoint's dtype) both compute in fp32, else ``bf16``."""
    trainer = params_dtype if params_dtype != "auto" else ("bfloat16" if use_gpu else "float32")
    engine = engine_dtype
    if engine == "auto":
        try:
            from megatron_pc.rollout.vllm_engine import checkpoint_dtype

            engine = checkpoint_dtype(model_path)
        except (OSError, ValueError, ImportError):
            engine = "auto"  # unreadable: judge as 16 bits (the lenient thresholds)
    return "fp32" if trainer == "float32" and engine == "float32" else "bf16"


class SyncCheck:
    """Judges each step's per-engine gaps; keeps the strike count between steps."""

    def __init__(self, cfg: RolloutConfig, precision: str) -> None:
        self.precision = precision
        self.warn = cfg.gap_warn(precision)
        self.far = LOGPROB_GAP_FAR * self.warn
        self.hard = cfg.logprob_gap_break
        self.strikes_allowed = cfg.logprob_gap_strikes
        self.strikes: dict[str, int] = {}

    def judge(self, step: int, gaps: Mapping[str, float]) -> None:
        """Warn about, or stop the run on, the gaps of this step's check (engine name -> gap)."""
        for name, gap in gaps.items():
            if not math.isfinite(gap) or gap > self.hard:
                raise MegatronPCError(
                    f"step {step}: after the weight sync engine {name} and the trainer disagree: mean |log-prob gap| {gap:.3g} > "
                    f"rollout.logprob_gap_break {self.hard:g}: the sync or the name maps are broken"
                )
            self.strikes[name] = self.strikes.get(name, 0) + 1 if gap > self.far else 0
            if self.strikes[name] >= self.strikes_allowed:
                raise MegatronPCError(
                    f"step {step}: engine {name}'s mean |log-prob gap| was over {self.far:.3g} (10 x the {self.precision} warning "
                    f"threshold {self.warn:g}) in {self.strikes[name]} checks in a row, now {gap:.3g} "
                    f"(rollout.logprob_gap_strikes {self.strikes_allowed}): its weights do not match the trainer's"
                )
            if gap > self.warn:
                logger.warning("step %d: engine %s mean |log-prob gap| %.3g after the sync is over the %s threshold %g "
                               "(rollout.logprob_gap_warn)", step, name, gap, self.precision, self.warn, extra=CONSOLE)  # fmt: skip

    def check(
        self, result: StepResult, policy: PolicyGroup, engines: Any,
        timer: Callable[[str], AbstractContextManager[Any]],
    ) -> float:  # fmt: skip
        """Engine vs trainer log-probs on the first rollout of up to 4 of the step's groups,
        after the sync, on every engine (a RestartingEngines); judged, then the worst engine's
        mean gap (NaN when the step trained no response)."""
        firsts = [TrainGroup(g.prompt, g.rollouts[:1], g.step) for g in result.groups[:4] if len(as_payload(g.rollouts[0].data).tokens)]
        if not firsts:
            return float("nan")
        with timer("sync_check"):
            seqs = groups_to_sequences(firsts, std_normalize=False)
            trainer_lp = policy.logprobs(seqs)
            per_engine = engines.call("sync check", lambda: engines.group.score_each([s.tokens for s in seqs]))
        gaps = {}
        for engine, engine_lp in zip(engines.group.engines, per_engine):
            # engine_lp[i][t] is the log-prob of token t+1; response tokens start at prompt_len.
            diffs = [abs(a - b) for s, t, e in zip(seqs, trainer_lp, engine_lp) for a, b in zip(t, e[s.prompt_len - 1 :])]
            if not diffs:
                raise MegatronPCError(f"the sync check compared no tokens of engine {engine.name}: engine and trainer log-probs are misaligned")
            gaps[engine.name] = sum(diffs) / len(diffs)
        logger.debug("sync check: gaps %s", gaps)
        self.judge(result.step, gaps)
        return max(gaps.values())
