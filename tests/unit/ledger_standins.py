"""Stand-in workers that book every call the driver makes into a memory ledger
(megatron_pc/launch/ledger.py): the stand-ins of standins.py, each call also one ledger event.

The mapping is what the real workers do at each call: ``load_hf`` / ``load`` fill the weights
(and, resuming, Adam's state) on the GPU, ``offload_for_generation`` frees the gradient buffer
and moves Adam's state to the host, the first ``train_update`` after it brings both back, an
engine takes its budget when it starts or wakes and gives it back when it sleeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from megatron_pc.launch.ledger import Ledger
from megatron_pc.rollout.group import EngineGroup
from standins import StandInEngine, StandInGroup, StandInWorkers

class LedgerGroup(StandInGroup):
    """A stand-in policy (or reference) group booking its calls."""

    def __init__(self, ledger: Ledger, dp: int = 1) -> None:
        super().__init__(dp)
        self.ledger = ledger
        self.away = False  # offloaded for generation

    def old_logprobs(self) -> None:
        self.ledger.book("old log-probs")
        super().old_logprobs()

    def ref_logprobs(self) -> list[Any]:
        self.ledger.book("reference")
        return super().ref_logprobs()

    def train_update(self, update: int, last_update: bool) -> dict[str, float]:
        if self.away:  # train_local's reload_for_training, before the first micro-batch
            self.ledger.book("reload")
            self.away = False
        self.ledger.book("update")
        return super().train_update(update, last_update)

    def logprobs(self, seqs: Any) -> list[list[float]]:
        self.ledger.book("sync check")
        return super().logprobs(seqs)

    def load_hf(self, path: str) -> None:
        self.ledger.book("load")
        super().load_hf(path)

    def load(self, path: str) -> None:
        self.ledger.book("resume load")
        super().load(path)

    def offload_for_generation(self, colocated: bool) -> dict[str, float]:
        self.ledger.book("offload")
        self.away = True
        return super().offload_for_generation(colocated)

    def save(self, path: str) -> None:
        self.ledger.book("checkpoint save")
        super().save(path)


class LedgerEngine(StandInEngine):
    """A stand-in engine booking generation, sleep, wake and scoring."""

    def __init__(self, ledger: Ledger, name: str) -> None:
        super().__init__(name)
        self.ledger = ledger
        ledger.book("engine start")

    def generate(self, requests: Any, sampling: Any) -> Any:
        self.ledger.book("generate")
        return super().generate(requests, sampling)

    def score(self, sequences: Any) -> list[list[float]]:
        self.ledger.book("sync check")
        return super().score(sequences)

    def sleep(self) -> None:
        self.ledger.book("sleep")

    def wake(self) -> None:
        self.ledger.book("wake")


class LedgerWorkers(StandInWorkers):
    """The Trainer's ``make_workers``: starts as RayWorkers does (policy ranks, the driver's
    ``ready`` hook, then the engines), booking every call into ``ledger``."""

    def __init__(self, ledger: Ledger, cfg: Any, model_path: str, run_dir: Path, transport: str) -> None:
        super().__init__(cfg, model_path, run_dir, transport)
        self.ledger = ledger
        self.policy = LedgerGroup(ledger)
        self.reference = LedgerGroup(ledger) if cfg.training.kl_coef > 0 else None
        self.engines = None

    def start(self, ready: Callable[[], None] | None = None) -> None:
        self.ledger.book("policy start")
        if ready is not None:
            ready()
        self.engines = EngineGroup(lambda k: LedgerEngine(self.ledger, f"engine{k}"), 1)

    def sync_weights(self) -> dict[str, float]:
        self.ledger.book("sync")
        return super().sync_weights()
