"""The memory ledger: the memory model's terms booked at every event of a run, in call order.

:mod:`megatron_pc.launch.memory_model` reckons each phase of a step on its own. A run also
passes through moments no phase describes: the engines start while the policy ranks hold
whatever they built, a resumed checkpoint is loaded, the first weight sync of a resume goes
into engines that are already awake. Whether such a moment fits depends on what the moments
before it left on the device, so the ledger keeps that state (where the gradient buffer and
Adam's state are, whether the engines are absent, awake or asleep) and books, at each
:data:`EVENTS` entry, the terms held per GPU and in one node's host memory.

Two users: ``megatron-pc plan`` replays :func:`run_events` (the driver's order, fresh and
resumed) and prints the peak event; ``tests/unit/test_memory_ledger.py`` drives the real
``Trainer`` with stand-in workers that book each call as it happens, and checks both that every
event fits and that the driver's order is :func:`run_events`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from megatron_pc.launch import memory_model as mm
from megatron_pc.models.shapes import ModelShape

EVENTS = (
    "policy start", "load", "resume load", "offload", "engine start", "generate", "sleep", "old log-probs",
    "reference", "reload", "update", "wake", "sync", "sync check", "checkpoint save",
)  # fmt: skip
"""What a run does, as the ledger books it (each policy, reference or engine call maps to one)."""
FORWARD_EVENTS = ("old log-probs", "reference", "sync check")
"""Events in which the policy (or reference) runs one forward micro-batch."""


def step_events(reference: bool, sleeps: bool = True) -> tuple[str, ...]:
    """One training step in the driver's order (``driver/trainer.py: Trainer._step``):
    generation, the engines asleep for the update, old (and reference) log-probs, the update
    (its first micro-batch brings back what generation offloaded), then the engines awake, the
    sync and the sync check. Without ``sleeps`` (pipelined): no sleep, offload nor wake."""
    update = ("old log-probs", *(("reference",) if reference else ()), "reload", "update")
    if not sleeps:
        return ("generate", *update, "sync", "sync check")
    return ("generate", "sleep", *update, "offload", "wake", "sync", "sync check")


def run_events(reference: bool, resume: bool, sleeps: bool = True) -> tuple[str, ...]:
    """A run of one step, validated and saved: the policy ranks start and load (the checkpoint
    when resuming) and give back what generation does not need BEFORE the engines start beside
    them; a resumed run pushes its weights into the new engines; validation at step 0 (fresh)
    or the resumed weights' first generation, the step, validation, the checkpoint."""
    start = ("policy start", "resume load" if resume else "load", "offload", "engine start")
    return (*start, *(("sync",) if resume else ()), *step_events(reference, sleeps), "generate", "checkpoint save")


@dataclass(frozen=True)
class Booking:
    """What one event holds: per kind of GPU (one colocated, policy and engine GPUs split) and
    in one node's host memory."""

    event: str
    gpus: tuple[mm.Phase, ...]
    host: mm.Phase

    def share(self, device_gib: float, host_gib: float) -> float:
        """The largest share of a device or of the host this event takes."""
        return max([g.total / device_gib for g in self.gpus] + [self.host.total / host_gib])


@dataclass
class Ledger:
    """The state a run leaves on its devices, and a :class:`Booking` for every event."""

    model: ModelShape
    inputs: mm.MemoryInputs
    device_gib: float
    host_gib: float
    policy_gpus_per_node: int
    engine_gpus_per_node: int
    bookings: list[Booking] = field(default_factory=list)
    policy_up: bool = False
    grads: str | None = None
    """Where the fp32 gradient buffer is: "gpu", or None (not built, or freed by the offload)."""
    optimizer: str | None = None
    """Where Adam's state is: "gpu", "host" (offloaded) or None (no policy yet)."""
    engine: str | None = None
    """None (not started), "awake" or "asleep"."""
    updated: bool = False

    def book(self, event: str) -> Booking:
        """Apply ``event`` to the state, then record what it holds."""
        if event not in EVENTS:
            raise ValueError(f"ledger event {event!r}: not one of {', '.join(EVENTS)}")
        self._apply(event)
        policy, engine = self._policy_terms(event), self._engine_terms(event)
        gpus = (mm.Phase("GPU", (*policy, *engine)),) if self.inputs.colocated else (
            mm.Phase("policy GPU", tuple(policy)), mm.Phase("engine GPU", tuple(engine)))
        booking = Booking(event, gpus, mm.Phase("host memory per node", tuple(self._host_terms())))
        self.bookings.append(booking)
        if event == "update":
            self.updated = True
        return booking

    def peak(self) -> Booking:
        """The event that takes the largest share of a device or of the host."""
        return max(self.bookings, key=lambda b: b.share(self.device_gib, self.host_gib))

    def over(self, limit: float = mm.LIMIT) -> list[str]:
        """Each event over ``limit`` of its device or of the host, with its largest term."""
        problems = []
        for b in self.bookings:
            for phase, capacity in [*((g, self.device_gib) for g in b.gpus), (b.host, self.host_gib)]:
                if phase.total > limit * capacity:
                    term = max(phase.terms, key=lambda t: t.gib)
                    problems.append(f"event {b.event} ({phase.name}): {phase.total:.1f} GiB over {limit:.0%} of "
                                    f"{capacity:.1f} GiB; largest term: {term.name} = {term.gib:.1f} GiB")  # fmt: skip
        return problems

    def _apply(self, event: str) -> None:
        m = self.inputs
        if event == "policy start":
            # Megatron's DDP builds the fp32 grad buffer and the distributed optimizer its fp32
            # shard with the model: both are on the GPU before any weight is loaded.
            self.policy_up, self.grads, self.optimizer = True, "gpu", "gpu"
        elif event == "offload":
            if m.colocated and m.offload_grads:
                self.grads = None  # freed, not copied: every update zeroes it first
            if m.colocated and m.offload_optimizer and m.params_bytes == 2:
                self.optimizer = "host"
        elif event == "reload":
            self.grads, self.optimizer = "gpu", "gpu"
        elif event in ("engine start", "wake"):
            self.engine = "awake"
        elif event == "sleep":
            self.engine = "asleep"

    def _policy_terms(self, event: str) -> list[mm.Term]:
        if not self.policy_up:
            return []
        m, model = self.inputs, self.model
        terms = [mm.weights_term(model, m), mm._runtime(), *mm.reference_term(model, m)]
        if self.grads == "gpu":
            terms.append(mm.grads_term(model, m))
        if self.optimizer == "gpu":
            terms.append(mm.optimizer_term(model, m))
        if event == "update":
            layers = math.ceil(model.layers / m.pipeline_parallel) * m.pipeline_parallel
            terms += [*mm.activations_term(model, m, layers, f"{layers} layers, 1F1B"),
                      *mm.logits_terms(model, m, m.micro_batch_tokens, with_grad=True)]  # fmt: skip
        elif event in FORWARD_EVENTS:
            terms += [*mm.activations_term(model, m, 1, "forward, one layer"),
                      *mm.logits_terms(model, m, m.micro_batch_tokens, with_grad=False)]  # fmt: skip
        elif event == "sync":
            terms.append(mm.sync_buffers(model, m, "policy"))
        if self.updated and not m.empty_cache:
            peak = sum(t.gib for t in mm.policy_update(model, m).terms if t.name != "vLLM worker asleep")
            held = sum(t.gib for t in terms)
            if peak > held:
                terms.append(mm.Term("allocator cache kept from the update", peak - held,
                                     "training.empty_cache off: the caching allocator keeps the update's peak reserved"))
        return terms

    def _engine_terms(self, event: str) -> list[mm.Term]:
        if self.engine is None:
            return []
        if self.engine == "asleep":
            return [mm.Term("vLLM worker asleep", mm.SLEEPING_ENGINE_GIB,
                            f"assumed: its CUDA context (sleep level {self.inputs.sleep_level} frees weights and KV cache)")]
        terms = [mm.engine_budget(self.inputs, self.device_gib)]
        if event == "sync":
            terms.append(mm.sync_buffers(self.model, self.inputs, "engine"))
        return terms

    def _host_terms(self) -> list[mm.Term]:
        m = self.inputs
        processes = (self.policy_gpus_per_node if self.policy_up else 0) + (self.engine_gpus_per_node if self.engine else 0)
        terms = [mm.Term("processes", processes * mm.HOST_PROCESS_GIB, f"{processes} processes x {mm.HOST_PROCESS_GIB:g} GiB (assumed)")]
        if self.engine == "asleep" and self.inputs.sleep_level == 1:
            per_gpu = self.model.total_params * 2 / m.engine_tensor_parallel / mm.GiB
            terms.append(mm.Term("vLLM weights asleep (pinned)", per_gpu * self.engine_gpus_per_node,
                                 f"{self.engine_gpus_per_node} engine GPUs x {per_gpu:.2f} GiB; sleep level 1 keeps them in host memory"))
        if self.optimizer == "host":
            opt = mm.optimizer_term(self.model, m)
            terms.append(mm.Term("optimizer state offloaded", opt.gib * self.policy_gpus_per_node,
                                 f"{self.policy_gpus_per_node} policy GPUs x {opt.gib:.2f} GiB"))
        return terms


def replay(ledger: Ledger, events: tuple[str, ...]) -> Ledger:
    """Book ``events`` in order; returns the ledger."""
    for event in events:
        ledger.book(event)
    return ledger
