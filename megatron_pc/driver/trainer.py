"""The single-controller training loop: one loop for Pilot-Commit, GRPO and DAPO.

    while not strategy.batch_ready():             # generation rounds
        plan = strategy.plan_round()              #   pilots + commits, or full groups
        samples = engines.generate(plan)          #   ONE call per round (binding)
        strategy.observe(plan, reward(samples))   #   classify, buffer, assemble groups
    groups = strategy.finish_step()
    old log-probs -> (reference) -> advantages -> policy update -> weight sync -> sync check
    -> validation -> metrics -> checkpoint

The strategy decides what to generate; the workers never decide; this file only moves data.
Pipelined (``training.pipelined``), step t+1's rounds run on a thread while step t trains
(driver.pipeline). Every other piece lives with the package whose job it is: Ray workers in
cluster, timing in metrics, the round in driver.rollouts, the update in driver.update.
"""

from __future__ import annotations

import logging
import signal
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Protocol

from megatron_pc.allocation import StepResult, build_strategy
from megatron_pc.allocation.metadata_prior import bucket_keys
from megatron_pc.allocation.trace import TraceWriter
from megatron_pc.cluster.nodes import NodeLostError
from megatron_pc.cluster.ray_workers import RayWorkers
from megatron_pc.config import Config, to_dict
from megatron_pc.console import CONSOLE
from megatron_pc.driver.checkpoints import CheckpointManager, on_preemption
from megatron_pc.driver.engines import RestartingEngines
from megatron_pc.driver.evaluation import Evaluator
from megatron_pc.driver.faults import Injector
from megatron_pc.driver.screen import Screen
from megatron_pc.driver.pipeline import Generated, Versions, pipeline_state, resume_pipeline, warn_uncorrected_lag
from megatron_pc.driver.rounds import generate_round, gradings_of, resolve_round, sample_rows, to_rollouts
from megatron_pc.driver.scoring import decode_and_score, reward_metrics
from megatron_pc.driver.sync_check import SyncCheck, pair_precision
from megatron_pc.driver.update import PolicyGroup, update_policy
from megatron_pc.errors import MegatronPCError
from megatron_pc.metrics.logger import open_metrics, report_peak_memory, wandb_naming
from megatron_pc.metrics.samples import SampleLog
from megatron_pc.metrics.phases import GENERATION_PHASES
from megatron_pc.metrics.timing import GenerationTally, Timer
from megatron_pc.platform import devices
from megatron_pc.reward.pool import RewardPool, reward_faults

logger = logging.getLogger(__name__)


class Workers(Protocol):
    """The processes a run drives: policy (and reference) ranks and rollout engines."""

    policy: PolicyGroup
    reference: PolicyGroup | None
    engines: Any  # an EngineGroup (megatron_pc.rollout.group)

    def start(self, ready: Callable[[], None]) -> None:
        """Start every worker (models built, engines ready); ``ready()`` runs once the policy
        ranks are up and, where engines share their GPUs, before those engines start."""

    def sync_weights(self) -> dict[str, float]:
        """Push the policy's weights into the engines; seconds and MB moved."""

    def restart_engine(self, index: int) -> None:
        """Start engine ``index`` anew (its process died) with the policy's current weights."""

    def peak_memory(self) -> dict[str, int]:
        """Peak RSS in bytes of the driver and of every worker, by name."""

    def close(self) -> None:
        """Stop every worker (safe to call after a failed start)."""


def ray_workers(cfg: Config, model_path: str, run_dir: Path, transport: str) -> RayWorkers:
    """The run's workers as Ray actors, given the component configs they take (not the root Config)."""
    return RayWorkers(cfg.cluster, cfg.layout, cfg.model, cfg.training, cfg.rollout, seed=cfg.seed, max_prompt_tokens=cfg.data.max_prompt_tokens,
                      model_path=model_path, run_dir=run_dir, transport=transport)  # fmt: skip


class Trainer:
    """Owns the run: data, strategy, workers, metrics and checkpoints."""

    def __init__(self, cfg: Config, data: Any, make_workers: Callable[..., Workers] | None = None) -> None:
        """``make_workers(cfg, model_path, run_dir, transport)`` gives the run's workers (default:
        
        :func:`ray_workers`; the unit tests pass in-process stand-ins)."""
        self.cfg, self.data = cfg, data  # data: megatron_pc.driver.prepare.RunData (prompts, token ids, tokenizer)
        self.make_workers = make_workers or ray_workers
        self.run_dir = cfg.resolved_run_dir
        self.checkpoints = CheckpointManager(self.run_dir, keep=cfg.training.keep_checkpoints, checksums=cfg.training.checkpoint_checksums)
        self.preempted = False
        self.faults = Injector.from_env()  # MEGATRON_PC_INJECT_FAULTS: the fault suite's signals
        self.resume_step, self.resume_path, traced = self.checkpoints.resume_point()
        trace = TraceWriter(self.run_dir / "trace.jsonl", keep_through_step=traced) if cfg.logging.trace else None
        self.strategy = build_strategy(cfg.allocation, len(data.train), cfg.seed, cfg.rollout.engines, trace)
        h = cfg.allocation.history
        if h.metadata:  # each prompt's bucket of the named record fields (docs/metadata_prior.md)
            self.strategy.set_prompt_metadata(bucket_keys(data.train, h.metadata, h.metadata_bins, h.metadata_noise, cfg.seed))
        self.screen = Screen(cfg, data)  # features for allocation.history.predictor, before each round
        self.tokens_total = 0
        self.engines: RestartingEngines | None = None  # the workers' engines, restarted when they die
        self.versions = Versions()
        self.pending: Generated | None = None  # pipelined: the next step, generated during this one
        self.step_samples: list[dict[str, Any]] = []  # the last step's rows for samples.jsonl
        warn_uncorrected_lag(cfg.training)
        # Refuse GPUs this Python cannot use, and a transport the devices cannot serve, before any worker starts.
        gpu = devices.use_gpus()
        self.transport = cfg.rollout.resolve_transport(use_gpu=gpu, colocated=cfg.cluster.colocated, pipeline_parallel=cfg.model.pipeline_parallel)
        self.sync_check = SyncCheck(cfg.rollout, pair_precision(cfg.model.params_dtype, cfg.rollout.dtype, gpu, str(data.model_path)))

    def on_signal(self, signum: int, _frame: Any) -> None:
        """Preemption: finish the current step, checkpoint, exit (see driver.train.PREEMPTED_EXIT)."""
        logger.warning("received %s: checkpointing after this step", signal.Signals(signum).name)
        self.preempted = True

    def run(self) -> dict[str, float]:
        """Train to ``training.steps``, or until ``training.rollout_budget`` rollouts are generated
        (or until preempted); returns the last step's metrics."""
        cfg = self.cfg
        workers = self.make_workers(cfg, str(self.data.model_path), self.run_dir, self.transport)
        on_preemption(self.on_signal)  # after ray.init, which installs its own SIGTERM handler
        last: dict[str, float] = {}
        self._ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate-ahead")  # pipelined mode's generation
        try:
            # The policy loads and gives back what generation does not need before colocated
            # engines take their share of the GPUs (launch/ledger.py books this order).
            workers.start(ready=lambda: self._load(workers))
            self.screen.start(workers)
            self.engines = RestartingEngines(workers.engines, workers.restart_engine, cfg.rollout.engine_restarts)
            if self.resume_path is not None:
                self._engines.call("weight sync", workers.sync_weights)  # the engines started from model.path
            with RewardPool(cfg.reward, max_tokens=cfg.rollout.max_tokens) as rewards:
                keep = cfg.logging.samples > 0
                evaluator = Evaluator(cfg, self.data, self.engines, rewards, self.run_dir / "validation" if keep else None)
                naming = wandb_naming(cfg.logging, cfg.name, cfg.allocation.strategy, cfg.seed, str(self.data.model_path))
                metrics = open_metrics(cfg.logging, self.run_dir, cfg.name, cfg.training.steps, self.resume_step or None, to_dict(cfg), naming)
                samples = SampleLog(self.run_dir / "samples.jsonl", self.resume_step or None, metrics.wandb) if keep else None
                try:
                    if self.resume_step == 0:
                        metrics.log(0, evaluator.run(step=0))
                        if samples is not None:
                            samples.write(0, [], evaluator.last_rows)
                    spent = cfg.training.budget_spent(self.strategy.acct.total["generated"])  # a resumed run that had spent it
                    for step in range(self.resume_step + 1, (cfg.training.steps if not spent else self.resume_step) + 1):
                        evaluator.last_rows = {}
                        last = self._step(step, workers, rewards, evaluator)
                        if samples is not None:
                            samples.write(step, self.step_samples, evaluator.last_rows)
                        metrics.log(step, last)
                        spent = cfg.training.budget_spent(last.get("cum_generated", 0))
                        if self.preempted or spent or step % cfg.training.save_every == 0 or step == cfg.training.steps:
                            self._save(step, workers.policy)
                        if self.preempted or spent:
                            break
                finally:
                    metrics.close()
                    if samples is not None:
                        samples.close()
                report_peak_memory(workers.peak_memory(), self.run_dir)
        except Exception as err:
            # A worker died: on a multi-node run (RayWorkers), first ask whether its node went
            # with it; a lost node stops the run for a requeue (megatron_pc.cluster.nodes).
            check_nodes = getattr(workers, "check_nodes", None)
            if check_nodes is not None and not isinstance(err, NodeLostError):
                check_nodes(f"the run's calls ({type(err).__name__})")
            raise
        finally:
            self._ahead.shutdown(wait=True)
            workers.close()
        return last

    def _step(self, step: int, workers: Workers, rewards: RewardPool, evaluator: Evaluator) -> dict[str, float]:
        """One step: its generation (done during the step before, when pipelined), the update,
        the weight sync, the sync check, validation; its metrics."""
        cfg, pipelined = self.cfg, self.cfg.training.pipelined
        timer = Timer(on_enter=lambda phase: self.faults.enter(phase, step))
        restarts, graded = self._engines.restarts, dict(rewards.counters)
        with timer("total"):
            gen, self.pending = self.pending, None
            if gen is None:  # not pipelined, or its first step (or a resume without a prefetched step)
                gen = self._generate_step(step, rewards, timer, lag=0)
            ahead: Future[Generated] | None = None
            cum, generated = gen.result.metrics.get("cum_generated", 0), gen.result.metrics.get("generated", 0)
            if pipelined and step < cfg.training.steps and not cfg.training.budget_spent(cum):
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
            self.versions.engines = step  # the engines hold the weights of the end of this step (an empty batch changed none)
            gap = self.sync_check.check(gen.result, workers.policy, self._engines, timer)
            val = {}
            if cfg.training.validation_due(step, cum, generated):
                with timer("validation"):
                    val = evaluator.run(step)
        self.tokens_total += gen.tokens
        self.step_samples = gen.samples
        seconds, ages = {**timer.seconds, **gen.seconds}, self.versions.ages(gen.result)  # generate / reward: when they ran
        self.versions.forget_before(step - cfg.allocation.max_commit_age - 1)
        gen_s = gen.seconds.get("generate", 0.0)
        return {
            **gen.result.metrics, **train, **gen.responses, **val, "logprob_gap": gap,
            **{f"time_{k}": v for k, v in seconds.items()},
            "generated_tokens": gen.tokens, "cum_generated_tokens": self.tokens_total,
            "gen_tokens_per_s": gen.tokens / gen_s if gen_s else 0.0,
            "generate_calls": gen.calls, "policy_lag": gen.lag,
            "rollout_age_mean": sum(ages) / len(ages) if ages else 0.0, "rollout_age_max": max(ages, default=0),
            "engine_restarts": self._engines.restarts - restarts, **self.screen.metrics(step),
            **reward_faults(graded, rewards.counters),
        }  # fmt: skip

    def _generate_step(self, step: int, rewards: RewardPool, timer: Timer, lag: int) -> Generated:
        """Rounds until step ``step``'s train batch is full, then the batch (``lag``: steps the
        engines' weights are behind the policy that will train it)."""
        self.versions.generated(step)
        tally = GenerationTally()
        picked: list[dict[str, Any]] = []  # the step's first logging.samples rollouts, for samples.jsonl
        extras: list[dict[str, float]] = []  # reward/<key> metrics: means over the step of a custom function's extra values
        while not self.strategy.batch_ready():
            self.screen.before_round(self.strategy, step)
            plan = self.strategy.plan_round()
            self.strategy.trace.emit({"event": "generate", "step": plan.step, "round": plan.round, "rollouts": plan.total_rollouts,
                                      "policy_version": self.versions.by_step.get(plan.step, self.versions.engines)})  # fmt: skip
            requests = resolve_round(plan, self.data.train_tokens, self.data.train.__getitem__)
            out, calls = generate_round(self._engines, plan, requests, self.cfg, timer)
            with timer("reward"):
                texts, scored = decode_and_score(self.data.tokenizer, out, gradings_of(requests), rewards)
            self.strategy.observe(plan, to_rollouts(requests, out, [(r.reward, r.correct) for r in scored]))
            tally.add_round([len(r.token_ids) for r in requests], out, calls)
            picked += sample_rows(step, requests, texts, scored, self.cfg.logging.samples - len(picked), self.data.train.__getitem__)
            extras += [r.metrics for r in scored if r.metrics]
        result = self.strategy.finish_step()
        if result.step != step:
            raise RuntimeError(f"generated step {result.step} where step {step} was due")
        responses = {**tally.metrics(), **reward_metrics(extras)}
        return Generated(result, tally.tokens, responses, timer.only(GENERATION_PHASES), lag, tally.calls, picked)

    def _update(self, result: StepResult, workers: Workers, timer: Timer, sync: bool = True) -> dict[str, float]:
        """The policy update (old log-probs once, then one optimizer update per mini-batch), then
        (unless pipelined, where it waits for the next step's generation) the weight sync."""
        if not result.groups:
            logger.warning("step %d: empty train batch (train_partial): no update", result.step)
            return {}
        if not self.cfg.training.pipelined:
            self._engines.sleep()  # colocated engines free the device while the policy trains
        out = update_policy(result.groups, self.cfg, workers.policy, workers.reference, timer)
        if not self.cfg.training.pipelined:
            # Colocated, the engines' memory is only there once the update's is freed (docs/memory.md).
            workers.policy.offload_for_generation(self.cfg.cluster.colocated)
            self._engines.wake()
        if sync:
            with timer("sync"):
                out.update(self._engines.call("weight sync", workers.sync_weights))
        return out

    def _load(self, workers: Workers) -> None:
        """Load the policy's weights: the latest complete checkpoint if there is one (with the
        loop's state), else the HF model; then offload what generation does not need. Runs
        before the engines start (``Workers.start``'s ``ready``); the resumed weights reach them after."""
        if self.resume_path is not None:
            logger.info("resuming from %s (step %d)", self.resume_path, self.resume_step, extra=CONSOLE)
            workers.policy.load(str(self.resume_path / "policy"))
            state = self.checkpoints.load_controller(self.resume_path)
            self.strategy.load_state_dict(state["strategy"])
            self.tokens_total = state["tokens_total"]
            self.versions, self.pending = resume_pipeline(state, self.resume_step)
            if self.pending is not None and not self.cfg.training.pipelined:
                raise MegatronPCError(f"{self.resume_path} was saved by a pipelined run (training.pipelined=true) with the next "
                                      "step already generated; resume it with training.pipelined=true")  # fmt: skip
        else:
            workers.policy.load_hf(str(self.data.model_path))
        if workers.reference is not None:
            workers.reference.load_hf(str(self.data.model_path))
        workers.policy.offload_for_generation(self.cfg.cluster.colocated)  # the grad buffer exists from the start

    def _save(self, step: int, policy: PolicyGroup) -> None:
        controller = {"step": step, "strategy": self.strategy.state_dict(), "tokens_total": self.tokens_total, "config": to_dict(self.cfg),
                      "pipeline": pipeline_state(self.versions, self.pending)}  # fmt: skip
        self.checkpoints.save_run(step, controller, policy, written=lambda: self.faults.enter("checkpoint", step))

    @property
    def _engines(self) -> RestartingEngines:
        assert self.engines is not None, "the workers have not started"
        return self.engines
