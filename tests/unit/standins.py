"""In-process stand-ins for the policy ranks and the rollout engines (no Ray, no Megatron).

The policy is a deterministic model with one parameter ``theta``:
``log p(token) = -theta * (1 + token % 7) / 10``. Its ranks take the same calls as
megatron_pc.cluster.ranks.MegatronRank, and its group the same as
megatron_pc.cluster.policy_group.MegatronGroup (the driver's PolicyGroup protocol), so the
driver's update and the training loop run unchanged against them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from megatron_pc.algo.losses import policy_loss
from megatron_pc.rollout.base import EngineError, GenerationResult, RolloutEngine, Sample, WeightPushStats
from megatron_pc.rollout.group import EngineGroup
from megatron_pc.training.payload import split_by_tokens


def token_logprob(theta: float, token: int) -> float:
    """The stand-in policy's log-prob of ``token``."""
    return -theta * (1 + token % 7) / 10


class ThetaModel:
    """The parameter every rank of a stand-in group shares (DP ranks hold equal replicas)."""

    def __init__(self) -> None:
        self.theta = 1.0
        self.schedule_steps = 0


class StandInRank:
    """One rank: keeps its DP group's rows and their old / reference log-probs."""

    def __init__(self, model: ThetaModel) -> None:
        self.model = model
        self.rows: Any = None
        self.seqs: list[Any] = []
        self.logprob_calls = 0

    def _logprobs(self, seq: Any) -> list[float]:
        return [token_logprob(self.model.theta, int(t)) for t in seq.tokens[seq.prompt_len :]]

    def load_rows(self, rows: Any) -> int:
        self.rows, self.seqs = rows, rows.sequences()
        return rows.rows

    def old_logprobs(self) -> None:
        self.logprob_calls += 1
        for s in self.seqs:
            s.old_logprobs = self._logprobs(s)

    def ref_logprobs(self) -> np.ndarray:
        self.logprob_calls += 1
        return np.array([v for s in self.seqs for v in self._logprobs(s)], dtype=np.float32)

    def set_ref_logprobs(self, flat: np.ndarray) -> None:
        start = 0
        for s in self.seqs:
            s.ref_logprobs = flat[start : start + s.response_len]
            start += s.response_len

    def update_rows(self, update: int) -> list[Any]:
        return [s for s, k in zip(self.seqs, self.rows.update) if k == update]


class StandInGroup:
    """``dp`` ranks, one per DP group (no TP/PP), over one shared :class:`ThetaModel`."""

    def __init__(self, dp: int = 1, model: ThetaModel | None = None) -> None:
        self.model = model or ThetaModel()
        self.ranks = [StandInRank(self.model) for _ in range(dp)]
        self.updates: list[dict[str, float]] = []
        self.loss_scales: list[float] = []
        self.shares: list[Any] = []

    @property
    def theta(self) -> float:
        return self.model.theta

    @property
    def logprob_calls(self) -> int:
        return self.ranks[0].logprob_calls

    # ---- the PolicyGroup protocol (megatron_pc.driver.update) ----
    def put_shares(self, plan: Any) -> list[Any]:
        self.shares = [plan.build(rows) for rows in split_by_tokens(plan.lengths, plan.update, len(plan.denominators), len(self.ranks))]
        return self.shares

    def load_rows(self, rows: Sequence[Any]) -> list[int]:
        return [rank.load_rows(share) for rank, share in zip(self.ranks, rows)]

    def old_logprobs(self) -> None:
        for rank in self.ranks:
            rank.old_logprobs()

    def ref_logprobs(self) -> list[Any]:
        return [rank.ref_logprobs() for rank in self.ranks]

    def set_ref_logprobs(self, flat: Sequence[Any]) -> None:
        for rank, mine in zip(self.ranks, flat):
            rank.set_ref_logprobs(mine)

    # ---- group-level methods (what every rank does together; rank 0's answer) ----
    def train_update(self, update: int, last_update: bool) -> dict[str, float]:
        """Score the update's rows of every DP group with the real loss, then move ``theta``."""
        seqs = [s for rank in self.ranks for s in rank.update_rows(update)]
        width = max(s.response_len for s in seqs)
        current, old, mask = (torch.zeros(len(seqs), width) for _ in range(3))
        for row, s in enumerate(seqs):
            current[row, : s.response_len] = torch.tensor(self.ranks[0]._logprobs(s))
            old[row, : s.response_len] = torch.as_tensor(s.old_logprobs, dtype=torch.float32)
            mask[row, : s.response_len] = 1.0
        advantages = torch.tensor([s.advantage for s in seqs])
        loss, metrics = policy_loss(current, old, advantages, mask, clip_low=0.2, clip_high=0.28, dual_clip=10.0, loss_agg="token-mean")
        self.model.theta += 0.3 * float(advantages.mean().sign() or 1.0)  # the update moves the policy
        self.loss_scales.append(self.shares[0].loss_scales[update])
        if last_update:
            self.model.schedule_steps += 1
        out = {"loss": float(loss), "grad_norm": 1.0, "update_ok": 1.0, "lr": 1e-3, **metrics}
        self.updates.append(out)
        return out

    def logprobs(self, seqs: Sequence[Any]) -> list[list[float]]:
        return [self.ranks[0]._logprobs(s) for s in seqs]

    def load_hf(self, path: str) -> None:
        self.model.theta = 1.0

    def offload_for_generation(self, colocated: bool) -> dict[str, float]:
        self.offloads = getattr(self, "offloads", 0) + 1
        return {"reserved_before_gb": 0.0, "reserved_after_gb": 0.0}

    def save(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "theta.json").write_text(json.dumps({"theta": self.model.theta, "steps": self.model.schedule_steps}))

    def load(self, path: str) -> None:
        state = json.loads((Path(path) / "theta.json").read_text())
        self.model.theta, self.model.schedule_steps = state["theta"], state["steps"]


class StandInEngine(RolloutEngine):
    """Samples one-token answers ("0".."9") with the stand-in policy's probabilities, seeded."""

    def __init__(self, name: str = "engine0", dies_at_call: int | None = None) -> None:
        self.name = name
        self.theta = 1.0
        self._alive = True
        self.calls = 0
        self.dies_at_call = dies_at_call  # its process "dies" in this generate call (1-based)

    def generate(self, requests: Sequence[Any], sampling: Any) -> GenerationResult:
        self.calls += 1
        if self.calls == self.dies_at_call or not self._alive:
            self._alive = False
            raise EngineError(self.name, "its process died")
        rng = random.Random(sampling.seed)
        weights = [np.exp(token_logprob(self.theta, t)) for t in range(10)]
        total = sum(weights)
        out = []
        for req in requests:
            picks = rng.choices(range(10), weights=weights, k=req.n)
            out.append([Sample([t], [float(np.log(weights[t] / total))], "stop") for t in picks])
        return GenerationResult(out)

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        # Scores with the policy's unnormalised log-probs, as the trainer stand-in does.
        return [[token_logprob(self.theta, int(t)) for t in seq[1:]] for seq in sequences]

    def update_weights(self, named_tensors: Any) -> WeightPushStats:
        self.theta = dict(named_tensors)["theta"]
        return WeightPushStats(tensors=1, bytes=8, seconds=0.0)

    @property
    def alive(self) -> bool:
        return self._alive

    def shutdown(self) -> None:
        self._alive = False


class StandInWorkers:
    """The Trainer's ``make_workers``: a stand-in policy group and one stand-in engine."""

    def __init__(self, cfg: Any, model_path: str, run_dir: Path, transport: str, dp: int = 1,
                 dies_at_call: Sequence[int | None] = ()) -> None:  # fmt: skip
        """``dies_at_call[i]``: the generate call in which the i-th engine made dies (the first,
        then each restarted one); engines made after the list runs out live."""
        self.policy = StandInGroup(dp)
        self.reference = StandInGroup(dp) if cfg.training.kl_coef > 0 else None
        self.made = 0
        self.deaths = list(dies_at_call)
        self.engines = EngineGroup(self._engine, 1)
        self.closed = False

    def _engine(self, k: int) -> StandInEngine:
        self.made += 1
        return StandInEngine(f"engine{k}", self.deaths.pop(0) if self.deaths else None)

    def restart_engine(self, index: int) -> None:
        self.engines.restart(index)
        self.sync_weights()

    def start(self, ready: Any = None) -> None:
        if ready is not None:
            ready()

    def sync_weights(self) -> dict[str, float]:
        for engine in self.engines.engines:
            engine.update_weights([("theta", self.policy.theta)])
        return {"sync_seconds": 0.0, "sync_mb": 0.0, "sync_mb_per_s": 0.0}

    def peak_memory(self) -> dict[str, int]:
        return {"driver": 1}

    def close(self) -> None:
        self.closed = True
