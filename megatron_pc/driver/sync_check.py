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
from collections.abc import Mapping

from megatron_pc.console import CONSOLE
from megatron_pc.errors import MegatronPCError
from megatron_pc.rollout.config import LOGPROB_GAP_FAR, RolloutConfig

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
