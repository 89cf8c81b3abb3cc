"""MoPPS: a Beta posterior per prompt, and Thompson sampling to choose the step's prompts.

Qu, Wang, Mao, Hu, Ommer, Ji, "Can Prompt Difficulty be Online Predicted for Accelerating RL
Finetuning of Reasoning Models?" (Model Predictive Prompt Selection, arXiv 2507.04632;
thu-rllab/MoPPS). Each prompt's success rate is a latent variable with a Beta(alpha, beta)
posterior. Each step draws ``candidates_ratio x train_batch`` candidate prompts, draws one
Thompson sample of the success rate from each candidate's posterior, and trains the
``train_batch`` candidates whose samples lie closest to ``target`` (0.5), each with n rollouts,
all trained on as GRPO does: no rollout is spent on choosing. After the rollouts each chosen
prompt's posterior becomes alpha <- decay x alpha + (1 - decay) x prior_alpha + successes (beta
likewise with the failures). Knobs (the authors' math scripts): :class:`MoppsConfig`.

In our loop: one round a step, like GRPO; the candidates not chosen were drawn (the epoch passes
over them, as the scripts' data loader does) but get no rollout.
"""

from __future__ import annotations

from typing import Any, Sequence

from megatron_pc.allocation.base import AllocationStrategy, full_requests
from megatron_pc.allocation.types import Request, Rollout, RoundPlan, TrainGroup


def closest_to_target(samples: dict[int, float], target: float, k: int) -> list[int]:
    """The ``k`` prompts whose samples lie closest to ``target`` (ties: the lower prompt id)."""
    return sorted(samples, key=lambda p: (abs(samples[p] - target), p))[:k]


class MoPPS(AllocationStrategy):
    """Thompson-sampled prompt selection over Beta posteriors; every chosen group is trained."""

    name = "mopps"
    trains_full_batch = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.alpha: dict[int, float] = {}
        self.beta: dict[int, float] = {}

    def posterior(self, prompt: int) -> tuple[float, float]:
        """(alpha, beta) of a prompt (the prior before its first rollouts)."""
        m = self.cfg.mopps
        return self.alpha.get(prompt, m.prior_alpha), self.beta.get(prompt, m.prior_beta)

    def _plan_requests(self) -> list[Request]:
        m = self.cfg.mopps
        k = min(m.candidates_ratio * self.cfg.train_batch, self.pool.drawable - len(self.batch))
        candidates = self._draw(k)
        samples = {p: self._rng.betavariate(*self.posterior(p)) for p in candidates}
        chosen = closest_to_target(samples, m.target, self.cfg.train_batch)
        self.acct.add("prompts_passed", len(candidates) - len(chosen))
        self.trace.emit({"event": "select", "step": self.step, "round": self.round, "target": m.target, "k": self.cfg.train_batch,
                         "candidates": [[p, samples[p]] for p in candidates], "chosen": chosen})  # fmt: skip
        return full_requests(chosen, self.cfg.n)

    def _observe(self, plan: RoundPlan, results: Sequence[Sequence[Rollout]]) -> None:
        m = self.cfg.mopps
        for req, rollouts in zip(plan.requests, results):
            group = TrainGroup(req.prompt, list(rollouts), self.step)
            self.batch.append(group)
            a, b = self.posterior(req.prompt)
            self.alpha[req.prompt] = m.decay * a + (1.0 - m.decay) * m.prior_alpha + group.successes
            self.beta[req.prompt] = m.decay * b + (1.0 - m.decay) * m.prior_beta + (group.size - group.successes)
            self.trace.emit({"event": "full", "step": plan.step, "round": plan.round, "prompt": req.prompt, "n": req.n,
                             "successes": group.successes, "kept": True})  # fmt: skip

    def _extra_gauges(self, groups: list[TrainGroup]) -> dict[str, float]:
        means = [self.alpha[g.prompt] / (self.alpha[g.prompt] + self.beta[g.prompt]) for g in groups]
        return {"mopps_posterior_mean": sum(means) / len(means) if means else 0.0, "mopps_prompts_known": float(len(self.alpha))}

    def _extra_state(self) -> dict[str, Any]:
        return {"posteriors": [[p, self.alpha[p], self.beta[p]] for p in sorted(self.alpha)]}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.alpha = {int(p): float(a) for p, a, _ in state["posteriors"]}
        self.beta = {int(p): float(b) for p, _, b in state["posteriors"]}
