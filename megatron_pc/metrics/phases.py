"""The phases of one training step: the one list of their names.

A step runs its phases in this order (``screen`` only when a screen asks for prompt features;
``pipeline_wait`` only when pipelined; ``reference`` only with a KL term; ``validation`` every
``training.validate_every`` steps). The timer (:class:`megatron_pc.metrics.timing.Timer`) takes
no other name, and each timed phase ``p`` becomes the metric ``time_p``; ``total`` times the
whole step around them. ``checkpoint`` is not timed: it is the point, after the policy's files
are written and before the manifest, where the fault suite can strike.

Readers of phases take named subsets of :data:`PHASES`, in its order, never their own list.
"""

from __future__ import annotations

PHASES: tuple[str, ...] = (
    "screen",  # prompt features for a screen (megatron_pc.driver.screen): a prefill on the policy ranks
    "generate",  # the rounds' engine calls
    "reward",  # decode and grade every sample
    "dispatch",  # each DP group's rows into the object store, loaded on the ranks
    "logprob",  # old log-probs, once per step
    "reference",  # reference log-probs (training.kl_coef > 0)
    "update",  # one optimizer update per mini-batch
    "pipeline_wait",  # pipelined: the next step's generation the update did not hide
    "sync",  # the policy's weights into the engines
    "sync_check",  # engine vs trainer log-probs on a few sequences
    "validation",  # the validation sets
    "checkpoint",  # not timed: where a fault can strike while a checkpoint is written
)

TOTAL = "total"
"""The timer's name for the whole step."""


def subset(*names: str) -> tuple[str, ...]:
    """``names`` in the order of :data:`PHASES`; a ValueError names any that is not a phase."""
    unknown = [n for n in names if n not in PHASES]
    if unknown:
        raise ValueError(f"not phases of a step: {unknown}; the phases are {list(PHASES)}")
    return tuple(p for p in PHASES if p in names)


FAULT_PHASES = subset("generate", "reward", "logprob", "update", "sync", "validation", "checkpoint")
"""Where ``MEGATRON_PC_INJECT_FAULTS`` can send a signal (megatron_pc.driver.faults)."""

FLOP_PHASES = subset("generate", "logprob", "reference", "update")
"""The phases whose model FLOPs are counted (megatron_pc.metrics.mfu)."""

BREAKDOWN_PHASES = subset("generate", "reward", "logprob", "reference", "update", "sync", "sync_check")
"""The phases a step-time breakdown reports (``megatron-pc bench step``, the run report's untimed
rest of a step)."""

GENERATION_PHASES = subset("generate", "reward")
"""The phases of a step's generation: timed when they ran (during the step before, when pipelined)."""
