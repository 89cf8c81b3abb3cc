"""The single-controller training loop: one loop for Pilot-Commit, GRPO and DAPO.

    while not strategy.batch_ready():             # generation rounds
        plan = strategy.plan_round()              #   pilots + commits, or full groups
        samples = engines.generate(plan)          #   ONE call per round (binding)
        strategy.observe(plan, reward(samples))   #   classify, buffer, assemble groups
    groups = strategy.finish_step()
    old log-probs -> (reference) -> advantages -> policy update -> weight sync -> metrics

The strategy decides what to generate; the workers never decide; this file only moves data.

Pipelined (``training.pipelined``, split placement): while the policy trains step t, a thread
runs step t+1's rounds on the engines, which still hold the weights of step t-1; the weights
are pushed when both are done. Every rollout is then one step off-policy: the trace records
the policy version behind each round (``generate`` events) and the metrics the lag and the
age of the rollouts trained on (Pilot-Commit's kept pilots are older by their buffer wait).
A checkpoint holds the prefetched step, so a resumed run continues exactly.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from megatron_pc.allocation import StepResult, TrainGroup, build_strategy
from megatron_pc.allocation.trace import TraceWriter
from megatron_pc.cluster import groups as G
from megatron_pc.driver.engines import RestartingEngines
from megatron_pc.driver.evaluation import Evaluator, decode_and_score
from megatron_pc.driver.faults import Injector
from megatron_pc.driver.sync_check import SyncCheck, pair_precision
from megatron_pc.driver.rollouts import groups_to_sequences, plan_to_requests, to_rollouts
from megatron_pc.driver.update import PolicyGroup, response_metrics, update_policy
from megatron_pc.config import Config, to_dict
from megatron_pc.console import CONSOLE
from megatron_pc.errors import MegatronPCError
from megatron_pc.metrics.logger import open_metrics
from megatron_pc.platform import devices
from megatron_pc.reward.pool import RewardPool
from megatron_pc.rollout.base import SamplingSettings, derive_seed
from megatron_pc.training.payload import as_payload
from megatron_pc.weight_sync.sync import sync_weights
from megatron_pc.driver.checkpoints import CheckpointManager

logger = logging.getLogger(__name__)

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Timer:
    """Seconds spent per phase within one step; ``on_enter(phase)`` is called as each begins
    (the fault injector's hook)."""

    def __init__(self, on_enter: Callable[[str], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.on_enter = on_enter

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if self.on_enter is not None:
            self.on_enter(phase)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start


@dataclass
class Generated:
    """One step's generation: its train batch and what it cost (measured when it ran: during the
    step before, when pipelined)."""

    result: StepResult
    tokens: int
    responses: dict[str, float]
    seconds: dict[str, float]
    """Seconds of its phases (generate, reward)."""
    lag: int
    """Steps between the weights that generated it and the policy it trains: 0, or 1 pipelined."""
    calls: int
    """Engine calls made (one per round with binding, two for a round of new prompts and commits without)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (rollout payloads included), for a pipelined checkpoint."""
        r = self.result
        return {"step": r.step, "groups": [g.to_json() for g in r.groups], "metrics": r.metrics, "partial": r.partial,
                "tokens": self.tokens, "responses": self.responses, "seconds": self.seconds, "lag": self.lag, "calls": self.calls}  # fmt: skip

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Generated":
        """Inverse of :meth:`to_json`."""
        result = StepResult(obj["step"], [TrainGroup.from_json(g) for g in obj["groups"]], obj["metrics"], obj["partial"])
        return cls(result, obj["tokens"], obj["responses"], obj["seconds"], obj["lag"], obj["calls"])


@dataclass
class Versions:
    """Which policy version (the step whose update made the weights; 0: the start model) the
    engines hold, and which one generated each recent step's rollouts."""

    engines: int = 0
    by_step: dict[int, int] = field(default_factory=dict)

    def generated(self, step: int) -> None:
        """Step ``step``'s rounds run now, on the engines' weights."""
        self.by_step[step] = self.engines

    def ages(self, result: StepResult) -> list[int]:
        """Age in steps of every rollout trained at ``result.step``: the policy that takes the
        update (step - 1) minus the version that generated it."""
        now = result.step - 1
        out = []
        for g in result.groups:
            pilot = self.by_step.get(g.pilot_step, 0) if g.pilot_step is not None else None
            mine = self.by_step.get(result.step, now)
            out += [now - (pilot if pilot is not None and i < g.n_pilot else mine) for i in range(g.size)]
        return out

    def forget_before(self, step: int) -> None:
        """Drop the versions of steps no buffered pilot can come from any more."""
        self.by_step = {s: v for s, v in self.by_step.items() if s >= step}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"engines": self.engines, "by_step": {str(s): v for s, v in self.by_step.items()}}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Versions":
        """Inverse of :meth:`to_json`."""
        return cls(obj["engines"], {int(s): v for s, v in obj["by_step"].items()})


class Workers(Protocol):
    """The processes a run drives: policy (and reference) ranks and rollout engines."""

    policy: PolicyGroup
    reference: PolicyGroup | None
    engines: Any  # an EngineGroup (megatron_pc.rollout.group)

    def start(self) -> None:
        """Start every worker (models built, engines ready)."""

    def sync_weights(self) -> dict[str, float]:
        """Push the policy's weights into the engines; seconds and MB moved."""

    def restart_engine(self, index: int) -> None:
        """Start engine ``index`` anew (its process died) with the policy's current weights."""

    def peak_memory(self) -> dict[str, int]:
        """Peak RSS in bytes of the driver and of every worker, by name."""

    def close(self) -> None:
        """Stop every worker (safe to call after a failed start)."""


class RayWorkers:
    """The run's workers as Ray actors in one placement group (megatron_pc.cluster.groups)."""

    def __init__(self, cfg: Config, model_path: str, run_dir: Path, transport: str) -> None:
        self.cfg, self.model_path, self.run_dir, self.transport = cfg, model_path, run_dir, transport
        bundles = cfg.model.tensor_parallel * cfg.model.pipeline_parallel * cfg.cluster.data_parallel + cfg.rollout.engines
        self.started = G.start_ray(cfg, bundles=bundles)
        self.placement: G.Placement | None = None
        self.policy: Any = None
        self.reference: Any = None
        self.engines: Any = None

    def start(self) -> None:
        """Placement group, policy and reference ranks, engines."""
        cfg = self.cfg
        gpu = _has_gpu()
        # Before any worker: Ray's GPUs must be usable here and enough for the layout.
        devices.check_gpu_count(G.devices_needed(cfg), G.ray_gpus(), use_gpu=gpu)
        self.placement = G.Placement(cfg, use_gpu=gpu)
        # The engines start while the Megatron ranks do (each takes tens of seconds on CPU),
        # except where they share GPUs: vLLM sizes its KV cache from the memory free when it
        # starts, which must not change under it while Megatron loads its weights.
        meanwhile = not gpu or cfg.cluster.placement == "split"
        self.policy = G.MegatronGroup(cfg, self.placement, trainable=True)
        self.reference = G.MegatronGroup(cfg, self.placement, trainable=False) if cfg.training.kl_coef > 0 else None
        megatron = [g for g in (self.policy, self.reference) if g is not None]
        if not meanwhile:
            for group in megatron:
                group.wait_ready()
        self.engines = G.engine_group(cfg, self.placement, self.model_path)
        if meanwhile:
            for group in megatron:
                group.wait_ready()

    def sync_weights(self) -> dict[str, float]:
        """Stream the policy's weights into every engine (rollout.weight_transport)."""
        return sync_weights(self.policy, self.engines, self.cfg.rollout.sync_bucket_mb, self.transport)

    def restart_engine(self, index: int) -> None:
        """A new engine actor in the dead one's bundle, then every engine gets the policy's weights."""
        self.engines.restart(index)
        self.sync_weights()

    def peak_memory(self) -> dict[str, int]:
        """Peak RSS of the driver and of every actor still alive."""
        return G.peak_memory(self.policy, self.reference, self.engines)

    def close(self) -> None:
        """Engines, placement group, then Ray (if this run started it)."""
        try:
            if self.engines is not None:
                self.engines.shutdown()
            if self.placement is not None:
                self.placement.remove()
        finally:
            G.stop_ray(self.started)


class Trainer:
    """Owns the run: data, strategy, workers, metrics and checkpoints."""

    def __init__(self, cfg: Config, data: Any, make_workers: Callable[..., Workers] | None = None) -> None:
        """``make_workers(cfg, model_path, run_dir, transport)`` gives the run's workers (default:
        :class:`RayWorkers`; the unit tests pass in-process stand-ins)."""
        self.cfg = cfg
        self.make_workers = make_workers or RayWorkers
        self.data = data  # megatron_pc.driver.prepare.RunData: prompts, token ids, tokenizer
        self.run_dir = cfg.resolved_run_dir
        self.checkpoints = CheckpointManager(self.run_dir, keep=cfg.training.keep_checkpoints, checksums=cfg.training.checkpoint_checksums)
        self.preempted = False
        self.faults = Injector.from_env()  # MEGATRON_PC_INJECT_FAULTS: the fault suite's signals
        latest = self.checkpoints.latest()
        self.resume_step, self.resume_path = latest if latest else (0, None)
        # A pipelined checkpoint also holds the next step, generated (and traced) before it was saved.
        traced = self.resume_step + (1 if latest and (self.checkpoints.load_controller(latest[1]).get("pipeline") or {}).get("pending") else 0)
        trace = TraceWriter(self.run_dir / "trace.jsonl", keep_through_step=traced if latest else None) if cfg.logging.trace else None
        self.strategy = build_strategy(cfg.allocation, len(data.train), cfg.seed, cfg.rollout.engines, trace)
        self.tokens_total = 0
        self.engines: RestartingEngines | None = None  # the workers' engines, restarted when they die
        self.versions = Versions()
        self.pending: Generated | None = None  # pipelined: the next step, generated during this one
        if cfg.training.pipelined and cfg.training.tis_cap is None:
            logger.warning("training.pipelined: every rollout is one step off-policy and training.tis_cap is off, so nothing "
                           "corrects it; set training.tis_cap (e.g. 2.0) to weight tokens by min(pi_old / pi_engine, cap)", extra=CONSOLE)  # fmt: skip
        # Refuse GPUs this Python cannot use, and a transport the devices cannot serve, before any worker starts.
        gpu = _has_gpu()
        self.transport = cfg.rollout.resolve_transport(use_gpu=gpu, colocated=cfg.cluster.placement == "colocated")
        self.sync_check = SyncCheck(cfg.rollout, pair_precision(cfg.model.params_dtype, cfg.rollout.dtype, gpu, str(data.model_path)))

    def on_signal(self, signum: int, _frame: Any) -> None:
        """Preemption: finish the current step, checkpoint, exit (see driver.PREEMPTED_EXIT)."""
        logger.warning("received %s: checkpointing after this step", signal.Signals(signum).name)
        self.preempted = True

    # ---- the loop -----------------------------------------------------------------------
    def run(self) -> dict[str, float]:
        """Train to ``training.steps`` (or until preempted); returns the last step's metrics."""
        cfg = self.cfg
        workers = self.make_workers(cfg, str(self.data.model_path), self.run_dir, self.transport)
        # ray.init installs its own SIGTERM handler; ours must come after it.
        install_signal_handlers(self)
        last: dict[str, float] = {}
        self._ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate-ahead")  # pipelined mode's generation
        try:
            workers.start()
            policy = workers.policy
            self.engines = RestartingEngines(workers.engines, workers.restart_engine, cfg.rollout.engine_restarts)
            with RewardPool(cfg.reward, max_tokens=cfg.rollout.max_tokens) as rewards:
                self._start(workers)
                evaluator = Evaluator(cfg, self.data, self.engines, rewards)
                metrics = open_metrics(cfg.logging, self.run_dir, cfg.name, cfg.training.steps, self.resume_step or None, to_dict(cfg))
                try:
                    if self.resume_step == 0:
                        metrics.log(0, evaluator.run(step=0))
                    for step in range(self.resume_step + 1, cfg.training.steps + 1):
                        last = self._step(step, workers, rewards, evaluator)
                        metrics.log(step, last)
                        if self.preempted or step % cfg.training.save_every == 0 or step == cfg.training.steps:
                            self._save(step, policy)
                        if self.preempted:
                            break
                finally:
                    metrics.close()
                self._report_memory(workers)
        finally:
            self._ahead.shutdown(wait=True)
            workers.close()
        return last

    def _report_memory(self, workers: Workers) -> None:
        """Peak RSS of every process, on the console and in peak_memory.json."""
        peaks = workers.peak_memory()
        (self.run_dir / "peak_memory.json").write_text(json.dumps(peaks, indent=1) + "\n")
        gib = {name: b / 2**30 for name, b in peaks.items()}
        logger.info("peak RSS: %s; total %.2f GiB", ", ".join(f"{n} {v:.2f} GiB" for n, v in gib.items()), sum(gib.values()), extra=CONSOLE)

    def _start(self, workers: Workers) -> None:
        """Load weights: the latest complete checkpoint if there is one, else the HF model."""
        if self.resume_path is not None:
            logger.info("resuming from %s (step %d)", self.resume_path, self.resume_step, extra=CONSOLE)
            workers.policy.call("load", str(self.resume_path / "policy"))
            state = self.checkpoints.load_controller(self.resume_path)
            self.strategy.load_state_dict(state["strategy"])
            self.tokens_total = state["tokens_total"]
            pipeline = state.get("pipeline") or {}
            self.versions = Versions.from_json(pipeline["versions"]) if "versions" in pipeline else Versions(self.resume_step)
            self.versions.engines = self.resume_step
            self.pending = Generated.from_json(pipeline["pending"]) if pipeline.get("pending") else None
            if self.pending is not None and not self.cfg.training.pipelined:
                raise MegatronPCError(f"{self.resume_path} was saved by a pipelined run (training.pipelined=true) with the next "
                                      "step already generated; resume it with training.pipelined=true")  # fmt: skip
            self._engines.call("weight sync", workers.sync_weights)
        else:
            workers.policy.call("load_hf", str(self.data.model_path))
        if workers.reference is not None:
            workers.reference.call("load_hf", str(self.data.model_path))

    def _step(self, step: int, workers: Workers, rewards: RewardPool, evaluator: Evaluator) -> dict[str, float]:
        cfg = self.cfg
        timer = Timer(on_enter=lambda phase: self.faults.enter(phase, step))
        restarts = self._engines.restarts
        graded = dict(rewards.counters)
        pipelined = cfg.training.pipelined
        with timer("total"):
            gen, self.pending = self.pending, None
            if gen is None:  # not pipelined, or its first step (or a resume without a prefetched step)
                gen = self._generate_step(step, rewards, timer, lag=0)
            ahead: Future[Generated] | None = None
            if pipelined and step < cfg.training.steps:
                # Step + 1's rounds on the engines, which keep the weights of step - 1 until the push.
                nxt = Timer(on_enter=lambda phase: self.faults.enter(phase, step + 1))
                ahead = self._ahead.submit(self._generate_step, step + 1, rewards, nxt, 1)
            try:
                train = self._update(gen.result, workers, timer, sync=not pipelined)
            except BaseException:
                if ahead is not None:
                    wait([ahead])  # let the generation thread end before the error unwinds the run
                raise
            if ahead is not None:
                with timer("pipeline_wait"):  # the part of the next step's generation the update did not hide
                    self.pending = ahead.result()
            if pipelined and gen.result.groups:
                with timer("sync"):
                    train.update(self._engines.call("weight sync", workers.sync_weights))
            # The engines now hold the weights of the end of this step (an empty batch changed none).
            self.versions.engines = step
            gap = self._check_sync(gen.result, workers.policy, self._engines, timer)
            val = {}
            if step % cfg.training.validate_every == 0 or step == cfg.training.steps:
                with timer("validation"):
                    val = evaluator.run(step)
        self.tokens_total += gen.tokens
        seconds = {**timer.seconds, **gen.seconds}  # generate / reward: when they ran, overlapped or not
        ages = self.versions.ages(gen.result)
        self.versions.forget_before(step - self.cfg.allocation.max_commit_age - 1)
        gen_s = gen.seconds.get("generate", 0.0)
        return {
            **gen.result.metrics, **train, **gen.responses, **val, "logprob_gap": gap,
            **{f"time_{k}": v for k, v in seconds.items()},
            "generated_tokens": gen.tokens, "cum_generated_tokens": self.tokens_total,
            "gen_tokens_per_s": gen.tokens / gen_s if gen_s else 0.0,
            "generate_calls": gen.calls, "policy_lag": gen.lag,
            "rollout_age_mean": sum(ages) / len(ages) if ages else 0.0, "rollout_age_max": max(ages, default=0),
            "engine_restarts": self._engines.restarts - restarts,
            **reward_faults(graded, rewards.counters),
        }  # fmt: skip

    def _generate_step(self, step: int, rewards: RewardPool, timer: Timer, lag: int) -> Generated:
        """Step ``step``'s rounds until its train batch is full, then the batch (``lag``: steps the
        engines' weights are behind the policy that will train it)."""
        self.versions.generated(step)
        tokens, responses, calls = self._generate(self._engines, rewards, timer)
        result = self.strategy.finish_step()
        if result.step != step:
            raise RuntimeError(f"generated step {result.step} where step {step} was due")
        return Generated(result, tokens, responses, {k: timer.seconds[k] for k in ("generate", "reward") if k in timer.seconds}, lag, calls)

    def _generate(self, engines: Any, rewards: RewardPool, timer: Timer) -> tuple[int, dict[str, float], int]:
        """Rounds until the train batch is full; generated tokens, response-length metrics, engine calls."""
        tokens = calls = prompt_tokens = 0
        pairs = 0.0  # (query, key) pairs attention scored, for the FLOP count
        lengths: list[int] = []
        finishes: list[str] = []
        while not self.strategy.batch_ready():
            plan = self.strategy.plan_round()
            self.strategy.trace.emit({"event": "generate", "step": plan.step, "round": plan.round, "rollouts": plan.total_rollouts,
                                      "policy_version": self.versions.by_step.get(plan.step, self.versions.engines)})  # fmt: skip
            requests = plan_to_requests(plan, self.data.train_tokens)
            parts = [list(range(len(requests)))]
            if not self.cfg.allocation.binding:  # new prompts, then commits: two calls
                new = [i for i, r in enumerate(plan.requests) if r.kind != "commit"]
                commits = [i for i, r in enumerate(plan.requests) if r.kind == "commit"]
                parts = [p for p in (new, commits) if p]
            outs = []
            for k, part in enumerate(parts):
                seed = derive_seed(self.cfg.seed, "round", plan.step, plan.round, *(["call", k] if k else []))
                with timer("generate"):
                    outs.append(engines.generate([requests[i] for i in part], SamplingSettings.from_config(self.cfg.rollout, seed=seed)))
            calls += len(parts)
            out = outs[0] if len(outs) == 1 else merge_results(outs, parts, len(requests))
            with timer("reward"):
                answers = [self.data.train[r.prompt].answer for r in plan.requests for _ in range(r.n)]
                scored = decode_and_score(self.data.tokenizer, out, answers, rewards)
            self.strategy.observe(plan, to_rollouts(out, scored))
            tokens += out.generated_tokens
            prompt_tokens += out.prompt_tokens
            for request, per_request in zip(requests, out.samples):
                p = len(request.prompt_token_ids)
                pairs += p * p / 2  # the prefill, once per request (its n samples share it)
                for sample in per_request:
                    r = len(sample.token_ids)
                    pairs += p * r + r * r / 2
                    lengths.append(r)
                    finishes.append(sample.finish_reason)
        return tokens, {**response_metrics(lengths, finishes), "gen_prompt_tokens": prompt_tokens, "gen_attention_pairs": pairs}, calls

    def _update(self, result: StepResult, workers: Workers, timer: Timer, sync: bool = True) -> dict[str, float]:
        """The policy update (old log-probs once, then one optimizer update per mini-batch), then
        (unless pipelined, where it waits for the next step's generation) the weight sync."""
        if not result.groups:
            logger.warning("step %d: empty train batch (train_partial): no update", result.step)
            return {}
        if not self.cfg.training.pipelined:
            self._engines.sleep()  # colocated engines free the device while the policy trains
        out = update_policy(result.groups, self.data.train_tokens, self.cfg, workers.policy, workers.reference, timer)
        if not self.cfg.training.pipelined:
            self._engines.wake()
        if sync:
            with timer("sync"):
                out.update(self._engines.call("weight sync", workers.sync_weights))
        return out

    def _check_sync(self, result: StepResult, policy: PolicyGroup, engines: Any, timer: Timer) -> float:
        """Engine vs trainer log-probs on a few sequences of this step, after the sync, on every
        engine; the worst engine's mean gap (judged by :class:`SyncCheck`)."""
        firsts = [_single(g) for g in result.groups[:4] if len(as_payload(g.rollouts[0].data).tokens)]
        if not firsts:
            return float("nan")
        with timer("sync_check"):
            seqs = groups_to_sequences(firsts, self.data.train_tokens, std_normalize=False)
            trainer_lp = policy.call("logprobs", seqs)
            per_engine = engines.call("sync check", lambda: engines.group.score_each([s.tokens for s in seqs]))
        gaps = {}
        for engine, engine_lp in zip(engines.group.engines, per_engine):
            # engine_lp[i][t] is the log-prob of token t+1; response tokens start at prompt_len.
            diffs = [abs(a - b) for s, t, e in zip(seqs, trainer_lp, engine_lp) for a, b in zip(t, e[s.prompt_len - 1 :])]
            if not diffs:
                raise MegatronPCError(f"the sync check compared no tokens of engine {engine.name}: engine and trainer log-probs are misaligned")
            gaps[engine.name] = sum(diffs) / len(diffs)
        logger.debug("sync check: gaps %s", gaps)
        self.sync_check.judge(result.step, gaps)
        return max(gaps.values())

    @property
    def _engines(self) -> RestartingEngines:
        assert self.engines is not None, "the workers have not started"
        return self.engines

    def _save(self, step: int, policy: PolicyGroup) -> None:
        pipeline = {"versions": self.versions.to_json(), "pending": self.pending.to_json() if self.pending is not None else None}
        controller = {"step": step, "strategy": self.strategy.state_dict(), "tokens_total": self.tokens_total, "config": to_dict(self.cfg),
                      "pipeline": pipeline}  # fmt: skip

        def write_policy(path: Path) -> None:
            policy.call("save", str(path))
            self.faults.enter("checkpoint", step)  # the policy written, the manifest not yet

        self.checkpoints.save(step, controller, write_policy)


def merge_results(outs: list[Any], parts: list[list[int]], n: int) -> Any:
    """Engine results of calls that each served ``parts[k]`` of ``n`` requests, as one result in request order."""
    from megatron_pc.rollout.base import GenerationResult

    samples: list[Any] = [None] * n
    for out, part in zip(outs, parts):
        for i, got in zip(part, out.samples):
            samples[i] = got
    return GenerationResult(samples, sum(o.prompt_tokens for o in outs), sum(o.generated_tokens for o in outs), sum(o.seconds for o in outs))


def reward_faults(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What went wrong in the reward pool between two readings of its counters: items that
    overran ``reward.timeout_s``, items whose worker died or raised (each graded 0), and the
    workers replaced."""
    def delta(reason: str) -> int:
        return after.get(reason, 0) - before.get(reason, 0)

    errors = sum(after[r] - before.get(r, 0) for r in after if r.startswith("error:"))
    return {"reward_timeouts": delta("timeout"), "reward_errors": delta("worker_died") + errors,
            "reward_worker_restarts": delta("worker_restarts")}  # fmt: skip


def _single(group: TrainGroup) -> TrainGroup:
    return TrainGroup(group.prompt, group.rollouts[:1], group.step)


def _has_gpu() -> bool:
    """Whether the run computes on GPUs; stops it (naming the venv and the fix) when the
    scheduler reports GPUs that this Python's torch cannot use."""
    return devices.use_gpus()


def install_signal_handlers(trainer: Trainer) -> None:
    """SIGTERM / SIGUSR1 (SLURM preemption) ask the trainer to checkpoint and stop."""
    for sig in PREEMPTION_SIGNALS:
        signal.signal(sig, trainer.on_signal)
