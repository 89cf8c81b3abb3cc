"""What every allocation strategy shares: the step/round cycle, the batch, accounting, state.

The driver runs, for every strategy alike::

    while not strategy.batch_ready():
        plan = strategy.plan_round()          # which prompts, how many rollouts each
        results = engines.generate(plan)      # ONE call for the whole round
        strategy.observe(plan, results)       # rewarded rollouts in, groups out
    step = strategy.finish_step()             # the train batch and its accounting

Strategies never touch a device, a process group or an engine.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar, Mapping, Sequence

from megatron_pc.allocation.accounting import Accounting
from megatron_pc.allocation.config import AllocationConfig
from megatron_pc.allocation.metadata_prior import index_buckets
from megatron_pc.allocation.pool import PromptPool
from megatron_pc.allocation.rng import rng_from_json, rng_to_json
from megatron_pc.allocation.trace import NullTrace, TraceSink
from megatron_pc.allocation.types import Request, RequestKind, Rollout, RoundPlan, StepResult, TrainGroup
from megatron_pc.errors import ConfigError, RoundLimitError


class AllocationStrategy(ABC):
    """Plans generation rounds and assembles the train batch of each step."""

    name: ClassVar[str]
    trains_full_batch: ClassVar[bool] = False
    """Every step trains on exactly train_batch x n rollouts (GRPO: nothing is filtered)."""
    drops_uniform_groups: ClassVar[bool] = False
    """Groups whose rewards are all equal are never trained (DAPO's dynamic sampling)."""

    evicts: ClassVar[bool] = False
    """A pilot may remove its prompt from the pool for good (Pilot-Commit's eviction)."""

    @classmethod
    def pilot_decision(cls, cfg: AllocationConfig, successes: int, n: int) -> str | None:
        """What a pilot (screen) of ``successes`` of ``n`` must decide: ``keep``, ``too_easy`` or
        ``too_hard`` (None: the strategy pilots nothing). The trace checker holds a run to it."""
        return None

    @classmethod
    def max_commit_age(cls, cfg: AllocationConfig) -> int | None:
        """The most steps between a pilot and its commit (None: no limit within an epoch)."""
        return cfg.max_commit_age

    @classmethod
    def rollouts_per_call(cls, cfg: AllocationConfig) -> int:
        """Rollouts per prompt of one generation call (what ``training.mini_batch_unit=call_rollouts``
        counts in): n, where every prompt gets its whole group at once."""
        return cfg.n

    @classmethod
    def check_pool(cls, cfg: AllocationConfig, pool_size: int) -> None:
        """Raise a ConfigError when a pool of ``pool_size`` prompts cannot serve this strategy's rounds."""

    @classmethod
    def check_config(cls, cfg: AllocationConfig, field_prefix: str = "") -> None:
        """Raise a ConfigError naming the field (under ``field_prefix``) when ``cfg`` cannot
        run this strategy. The root Config calls it when it loads; the strategy when it is built."""

    @classmethod
    def check_generation_ranks(cls, cfg: AllocationConfig, ranks: int, field_prefix: str = "") -> None:
        """Raise a ConfigError when this strategy's rounds cannot split evenly over ``ranks``
        generation engines."""
        if ranks < 1:
            raise ConfigError("rollout.engines", f"must be >= 1, got {ranks}")
        for name, rule in cls._rank_rules(cfg, ranks):
            raise ConfigError(f"{field_prefix}.{name}" if field_prefix else name, rule)

    @classmethod
    def _rank_rules(cls, cfg: AllocationConfig, ranks: int) -> Iterator[tuple[str, str]]:
        """(field, rule) of each setting that keeps this strategy's rounds from splitting evenly
        over ``ranks`` engines: a round of n rollouts for each of train_batch prompts."""
        if (cfg.train_batch * cfg.n) % ranks:
            yield "train_batch", f"train_batch x n = {cfg.train_batch * cfg.n} rollouts must divide evenly over {ranks} generation engines"

    def __init__(
        self,
        cfg: AllocationConfig,
        pool_size: int,
        seed: int,
        generation_ranks: int = 1,
        trace: TraceSink | None = None,
    ) -> None:
        self.check_config(cfg, field_prefix="allocation")
        self.check_generation_ranks(cfg, generation_ranks, field_prefix="allocation")
        if pool_size < cfg.train_batch:
            raise ConfigError(
                "allocation.train_batch",
                f"the prompt pool has {pool_size} prompts, fewer than train_batch ({cfg.train_batch}): a batch would repeat prompts",
            )
        self.check_pool(cfg, pool_size)
        self.cfg = cfg
        self.ranks = generation_ranks
        self.trace: TraceSink = trace if trace is not None else NullTrace()
        self.pool = PromptPool(pool_size, seed)
        self.acct = Accounting()
        self.step = 1
        self.round = 0
        self.batch: list[TrainGroup] = []
        self._rng = random.Random(seed + 1)
        self._pending: RoundPlan | None = None
        self.buckets: list[int] | None = None  # prompt -> its metadata bucket (set_prompt_metadata)
        self.bucket_names: list[str] = []
        self._covered: set[int] = set()  # buckets trained this epoch

    # ---- the cycle -------------------------------------------------------------------
    def batch_ready(self) -> bool:
        """True when this step's batch is complete (or may be trained partially)."""
        if len(self.batch) >= self.cfg.train_batch:
            return True
        # train_partial: the step ends even with an empty batch (the trainer then skips the update).
        return self.cfg.on_round_limit == "train_partial" and self.round >= self.cfg.max_rounds

    def plan_round(self) -> RoundPlan:
        """The next generation round. Raises RoundLimitError when the limit is spent."""
        if self._pending is not None:
            raise RuntimeError("plan_round called twice without observe: every plan must be observed")
        if self.batch_ready():
            raise RuntimeError("the train batch is complete: call finish_step before planning more rounds")
        if self.round >= self.cfg.max_rounds:
            raise RoundLimitError(self._round_limit_message())
        if self.pool.drawable == 0:
            raise RoundLimitError(f"step {self.step}: every prompt of the pool has been evicted; nothing is left to train on")
        self.round += 1
        self.acct.add("rounds")
        plan = RoundPlan(self.step, self.round, self._plan_requests())
        self._pending = plan
        for kind in ("pilot", "commit", "full"):
            self.acct.add(f"generated_{kind}", plan.rollouts_of(kind))
        self.acct.add("generated", plan.total_rollouts)
        return plan

    def observe(self, plan: RoundPlan, results: Sequence[Sequence[Rollout]]) -> None:
        """Take the rewarded rollouts of ``plan``: ``results[i]`` answers ``plan.requests[i]``."""
        if plan is not self._pending:
            raise RuntimeError("observe got a plan that is not the pending one")
        if len(results) != len(plan.requests):
            raise ValueError(f"round {plan.round}: {len(plan.requests)} requests but {len(results)} results")
        for i, (req, got) in enumerate(zip(plan.requests, results)):
            if len(got) != req.n:
                raise ValueError(f"round {plan.round}, request {i} (prompt {req.prompt}, {req.kind}): asked for {req.n} rollouts, got {len(got)}")
        self._pending = None
        self._observe(plan, results)

    def finish_step(self) -> StepResult:
        """Hand over the train batch, close the step's accounting and start the next step."""
        if not self.batch_ready():
            raise RuntimeError(f"step {self.step}: the train batch has {len(self.batch)}/{self.cfg.train_batch} groups")
        groups, self.batch = self.batch, []
        partial = len(groups) < self.cfg.train_batch
        for g in groups:
            self.trace.emit({"event": "train_group", "step": self.step, "prompt": g.prompt, "size": g.size, "successes": g.successes})
        if self.buckets is not None:
            self._covered.update(self.buckets[g.prompt] for g in groups)
        self.acct.add("trained_groups", len(groups))
        self.acct.add("trained_rollouts", sum(g.size for g in groups))
        self.acct.add("partial_steps", int(partial))
        age_evicted = self._end_step()
        gauges = self._gauges(groups)
        metrics = self.acct.close_step(gauges)
        self.trace.emit(
            {
                "event": "step_end",
                "step": self.step,
                "generated": {k: metrics[f"generated_{k}"] for k in ("pilot", "commit", "full")},
                "trained": metrics["trained_rollouts"],
                "buffer_size": gauges["buffer_size"],
                "age_evicted": age_evicted,
                "rounds": metrics["rounds"],
                "partial": partial,
            }
        )
        self.trace.flush()
        result = StepResult(self.step, groups, metrics, partial)
        self.step += 1
        self.round = 0
        return result

    # ---- metadata (allocation.history.metadata; megatron_pc.allocation.metadata_prior) -----------
    def set_prompt_metadata(self, keys: Sequence[str]) -> None:
        """Give every prompt of the pool its metadata bucket (``keys[prompt]``), before the first
        round. The share of buckets trained in the epoch is then reported (``bucket_coverage``)."""
        if len(keys) != self.pool.size:
            raise ValueError(f"metadata: {len(keys)} bucket keys for a pool of {self.pool.size} prompts")
        self.bucket_names, self.buckets = index_buckets(keys)

    def _coverage_gauges(self) -> dict[str, float]:
        if self.buckets is None:
            return {}
        return {"bucket_coverage": len(self._covered) / len(self.bucket_names), "buckets_trained": len(self._covered)}

    # ---- features (the screen's predictor; megatron_pc.allocation.feature_sources) --------------
    def feature_requests(self) -> list[int]:
        """Prompts whose features the next rounds want (ask before every ``plan_round``): the new
        prompts the strategy may draw next, a bounded look-ahead, less those it holds already.
        Empty unless the strategy predicts from features."""
        return []

    def observe_features(self, features: Mapping[int, Any], step: int) -> None:
        """Take the features of the prompts :meth:`feature_requests` named, computed with the
        policy of ``step`` (``{prompt: 1-D array}``). Features nobody asked for are refused."""
        if features:
            raise RuntimeError(f"{self.name} asked for no features but got {len(features)}")

    # ---- shared helpers --------------------------------------------------------------
    def _draw(self, k: int, exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
        """Draw ``k`` prompts, none of this step's batch nor of ``exclude``, crossing into the
        next epoch when this one runs out."""
        # No prompt twice in one batch, also when the batch's rounds cross an epoch boundary.
        in_batch = {g.prompt for g in self.batch} | exclude
        if k > self.pool.drawable - len(in_batch):
            raise RoundLimitError(
                f"step {self.step}: a round needs {k} distinct prompts but only {self.pool.drawable - len(in_batch)} "
                f"are left in the pool outside this step's batch"
            )
        out = self.pool.draw(k, exclude=in_batch)
        while len(out) < k:
            self._end_epoch()
            out += self.pool.draw(k - len(out), exclude=in_batch | set(out))
        self.acct.add("prompts_drawn", len(out))
        return out

    def _end_epoch(self) -> None:
        self._on_epoch_end()
        self.pool.end_epoch()
        coverage = {"bucket_coverage": self._coverage_gauges()["bucket_coverage"]} if self.buckets is not None else {}
        self.trace.emit({"event": "epoch_end", "step": self.step, "epoch": self.pool.epoch - 1, "evicted_total": self.pool.counts()["evicted"], **coverage})
        self._covered = set()

    def _gauges(self, groups: list[TrainGroup]) -> dict[str, float]:
        n = max(len(groups), 1)
        pool = self.pool.counts()
        rewards = sum((g.reward_sum for g in groups), 0.0)
        rollouts = sum(g.size for g in groups)
        return {
            "step": self.step,
            "epoch": self.pool.epoch,
            "batch_groups": len(groups),
            "reward_mean": rewards / max(rollouts, 1),
            "zero_variance_share": sum(1 for g in groups if not g.informative) / n,
            "group_reward_var_mean": sum(g.reward_variance for g in groups) / n,
            "buffer_size": self._buffer_size(),
            "pool_active": pool["active"],
            "pool_deferred": pool["deferred"],
            "pool_evicted": pool["evicted"],
            **self._coverage_gauges(),
            **self._extra_gauges(groups),
        }

    def _round_limit_message(self) -> str:
        return (
            f"step {self.step}: the train batch holds {len(self.batch)}/{self.cfg.train_batch} groups after "
            f"{self.cfg.max_rounds} generation rounds (allocation.max_rounds). {self._shortfall_hint()} "
            "Set allocation.on_round_limit=train_partial to train on the partial batch instead."
        )

    # ---- what strategies provide -------------------------------------------------------
    @abstractmethod
    def _plan_requests(self) -> list[Request]:
        """The requests of the next round."""

    @abstractmethod
    def _observe(self, plan: RoundPlan, results: Sequence[Sequence[Rollout]]) -> None:
        """Classify results and append finished groups to ``self.batch``."""

    def _end_step(self) -> int:
        """Per-step housekeeping; returns how many buffered pilots aged out."""
        return 0

    def _on_epoch_end(self) -> None:
        """Epoch-end housekeeping before the pool reshuffles."""

    def _buffer_size(self) -> int:
        return 0

    def _extra_gauges(self, groups: list[TrainGroup]) -> dict[str, float]:
        return {}

    def _shortfall_hint(self) -> str:
        return ""

    # ---- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state between rounds; restoring it reproduces every future decision."""
        if self._pending is not None:
            raise RuntimeError("cannot save allocation state while a round is being generated")
        return {
            "strategy": self.name,
            "step": self.step,
            "round": self.round,
            "batch": [g.to_json() for g in self.batch],
            "rng": rng_to_json(self._rng),
            "pool": self.pool.state_dict(),
            "accounting": self.acct.state_dict(),
            **({"covered": sorted(self._covered)} if self.buckets is not None else {}),
            **self._extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (from the same strategy)."""
        if state["strategy"] != self.name:
            raise ValueError(f"checkpoint holds {state['strategy']!r} allocation state, this run uses {self.name!r}")
        self.step = state["step"]
        self.round = state["round"]
        self.batch = [TrainGroup.from_json(g) for g in state["batch"]]
        self._rng = rng_from_json(state["rng"])
        self.pool.load_state_dict(state["pool"])
        self.acct.load_state_dict(state["accounting"])
        self._covered = {int(b) for b in state.get("covered", [])}
        self._load_extra_state(state)

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        pass


def full_requests(prompts: list[int], n: int, kind: RequestKind = "full") -> list[Request]:
    """``n`` rollouts for each prompt."""
    return [Request(p, n, kind) for p in prompts]
