"""Policy and reference workers over Megatron-Core: one per process, TP x PP x DP groups.

Two ways in: ``compute_logprobs`` / ``train_step`` take the *global* batch, and each DP rank
works on its strided slice (``seqs[dp::DP]``), results coming back in input order on every rank;
``local_logprobs`` / ``train_local`` take the DP rank's own sequences (the driver's path: each DP
group is sent only its share, see megatron_pc.training.payload).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from megatron_pc import platform
from megatron_pc.models.config import ModelConfig
from megatron_pc.models.hf_config import HFArch, load_arch
from megatron_pc.models.hf_weights import load_hf_weights
from megatron_pc.training import prompt_features as features, steps
from megatron_pc.algo.losses import loss_denominator
from megatron_pc.training.batching import MicroBatch, Sequence, micro_batches
from megatron_pc.training.config import TrainingConfig
from megatron_pc.training.prompt_features import PromptFeatures, PromptTokens
from megatron_pc.training.memory import offload_for_generation, reload_for_training
from megatron_pc.training.setup import build_model, build_optimizer

logger = logging.getLogger(__name__)


def default_loss_fn() -> steps.LossFn:
    """The project's policy loss (megatron_pc.algo.losses.policy_loss)."""
    from megatron_pc.algo.losses import policy_loss

    return policy_loss


class ReferenceWorker:
    """A frozen model that computes per-token log-probs and entropy of responses."""

    trainable = False

    def __init__(self, model_cfg: ModelConfig, arch: HFArch | None = None, micro_batch_tokens: int = 4096,
                 logprob_chunk_tokens: int | None = TrainingConfig.logprob_chunk_tokens,
                 sequence_parallel: bool | None = TrainingConfig.sequence_parallel) -> None:
        from megatron.core import parallel_state as ps

        self.model_cfg = model_cfg
        self.arch = arch or load_arch(model_cfg.path)
        self.micro_batch_tokens = micro_batch_tokens
        self.logprob_chunk_tokens = logprob_chunk_tokens
        if sequence_parallel is None:
            sequence_parallel = model_cfg.tensor_parallel > 1 and platform.on_gpu()
        self.sequence_parallel = sequence_parallel
        self.model = build_model(self.arch, model_cfg, trainable=self.trainable, sequence_parallel=sequence_parallel)
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()

    @property
    def module(self) -> torch.nn.Module:
        """The bare GPTModel (unwrapped from DDP)."""
        return getattr(self.model, "module", self.model)

    def load_hf(self, model_dir: str | Path | None = None) -> None:
        """Load the HF safetensors weights (default: ``model.path``)."""
        load_hf_weights(self.module, model_dir or self.model_cfg.path, self.arch)

    def _schedule(self, step_fn: Callable, mbs: list[MicroBatch], forward_only: bool) -> list[Any]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        return get_forward_backward_func()(
            forward_step_func=step_fn, data_iterator=iter(mbs), model=[self.model],
            num_microbatches=len(mbs), seq_length=max(mb.input_ids.shape[1] for mb in mbs),
            micro_batch_size=max(mb.input_ids.shape[0] for mb in mbs),
            forward_only=forward_only, collect_non_loss_data=forward_only,
        )

    def _micro_batches(self, seqs: list[Sequence], token_budget: int) -> list[MicroBatch]:
        """``seqs`` packed into micro-batches; with sequence parallelism each is right-padded
        to a multiple of TP (the sequence is split over the TP ranks)."""
        mbs = micro_batches(seqs, token_budget)
        if self.sequence_parallel:
            mbs = [steps.pad_to_multiple(mb, self.model_cfg.tensor_parallel) for mb in mbs]
        return mbs

    def _local(self, seqs: list[Sequence]) -> list[int]:
        return list(range(self.dp_rank, len(seqs), self.dp_size))

    @torch.no_grad()
    def compute_logprobs(self, seqs: list[Sequence]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(log-probs, entropy) of each sequence's response tokens, on every rank (``seqs`` is the
        global batch: each DP rank computes its strided slice, then the ranks share them)."""
        local = self._local(seqs)
        mine = dict(zip(local, self.local_logprobs([seqs[i] for i in local])))
        return _dp_share(mine, len(seqs))

    @torch.no_grad()
    def local_logprobs(self, seqs: list[Sequence]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(log-probs, entropy) of this DP rank's own ``seqs``, on every rank of its DP group."""
        mbs = self._micro_batches(seqs, self.micro_batch_tokens)
        step_fn = steps.logprob_step(self.arch.vocab_size, self.logprob_chunk_tokens)
        outputs = self._schedule(step_fn, mbs, forward_only=True) if mbs else []
        mine: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for out in outputs:
            for row, i in enumerate(out["index"]):
                span = slice(seqs[i].prompt_len - 1, len(seqs[i].tokens) - 1)
                mine[i] = (out["logprobs"][row, span].clone(), out["entropy"][row, span].clone())
        return _pp_share(mine, len(seqs))

    @torch.no_grad()
    def prompt_features(self, prompts: list[PromptTokens]) -> PromptFeatures | None:
        """The final hidden state (after the final norm, fp32) at each prompt's last token,
        from a prefill of the prompts alone (megatron_pc.training.prompt_features). ``prompts`` is the
        global list, the same on every rank: each DP group forwards its share, and the last
        pipeline stage's TP rank 0 returns the group's part; every other rank returns None
        (:func:`~megatron_pc.training.prompt_features.assemble_features` joins the parts)."""
        from megatron.core import parallel_state as ps

        features.check_supported()
        local = features.dp_share([len(p) for p in prompts], self.dp_rank, self.dp_size)
        multiple = self.model_cfg.tensor_parallel if self.sequence_parallel else 1
        batches = features.prompt_batches([prompts[i] for i in local], self.micro_batch_tokens, multiple)
        with features.hidden_states_out(self.module):
            outputs = self._schedule(features.feature_step(self.sequence_parallel), batches, forward_only=True) if batches else []
        if not ps.is_pipeline_last_stage(ignore_virtual=True) or ps.get_tensor_model_parallel_rank() != 0:
            return None
        values = np.zeros((len(local), self.arch.hidden_size), dtype=np.float32)
        for out in outputs:
            values[out["index"]] = out["features"].numpy()
        return PromptFeatures(index=np.asarray(local, dtype=np.int64), values=values, tokens=sum(b.tokens for b in batches),
                              padded=sum(b.input_ids.numel() for b in batches))


def _from_last_stage(mine: dict[int, Any]) -> dict[int, Any]:
    """The last pipeline stage's results, on every stage of the pipeline."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() > 1:
        box = [mine]
        dist.broadcast_object_list(box, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group())
        mine = box[0]
    return mine


def _pp_share(mine: dict[int, Any], total: int) -> list[Any]:
    """Results of the last pipeline stage, in order, on every stage of the pipeline."""
    mine = _from_last_stage(mine)
    return [mine[i] for i in range(total)]


def _dp_share(mine: dict[int, Any], total: int) -> list[Any]:
    """Each DP rank's results (keyed by global position), gathered on every rank."""
    from megatron.core import parallel_state as ps

    if ps.get_data_parallel_world_size() > 1:
        parts: list[dict[int, Any]] = [{} for _ in range(ps.get_data_parallel_world_size())]
        dist.all_gather_object(parts, mine, group=ps.get_data_parallel_group())
        mine = {k: v for part in parts for k, v in part.items()}
    return [mine[i] for i in range(total)]


def _share(mine: dict[int, Any], total: int) -> list[Any]:
    """Results of the last pipeline stage of every DP rank, gathered on every rank."""
    return _dp_share(_from_last_stage(mine), total)


class PolicyWorker(ReferenceWorker):
    """The trained model: log-probs, policy-loss train steps, checkpoints."""

    trainable = True

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainingConfig, arch: HFArch | None = None,
                 loss_fn: steps.LossFn | None = None) -> None:
        super().__init__(model_cfg, arch, train_cfg.micro_batch_tokens, train_cfg.logprob_chunk_tokens,
                         train_cfg.sequence_parallel)
        self.train_cfg = train_cfg
        self.loss_fn = loss_fn or default_loss_fn()
        self.optimizer, self.scheduler = build_optimizer(self.model, model_cfg, train_cfg)
        self.step = 0
        self._offloaded: dict[str, Any] = {}

    def load_hf(self, model_dir: str | Path | None = None) -> None:
        """Load HF weights, then refresh the optimizer's copies of them (the distributed and
        mixed-precision optimizers keep fp32 main parameters)."""
        super().load_hf(model_dir)
        self.optimizer.reload_model_params()

    def train_step(self, seqs: list[Sequence], loss_scale: float = 1.0, last_update: bool = True) -> dict[str, float]:
        """One optimizer update on the global batch ``seqs``; returns global metrics.

        A training step may take several updates (mini-batches) over old log-probs computed once
        before the first: the LR schedule and ``self.step`` advance only with ``last_update``, so
        the schedule counts training steps whatever the number of mini-batches. ``loss_scale``
        weighs this update's loss (the reference scales a short last mini-batch by its share).
        """
        local = [seqs[i] for i in self._local(seqs)]
        return self.train_local(local, loss_denominator([s.response_len for s in seqs], self.train_cfg.loss_agg) / loss_scale, loss_scale, last_update)

    def train_local(self, seqs: list[Sequence], denominator: float, loss_scale: float = 1.0, last_update: bool = True) -> dict[str, float]:
        """One optimizer update in which this DP rank trains its own ``seqs``; ``denominator``
        is the update's global loss denominator over its loss scale (the same on every rank).
        Every DP rank must have at least one sequence. Returns global metrics."""
        if not seqs:
            raise ValueError(f"data-parallel rank {self.dp_rank} has no sequence in this update")
        self.reload_for_training()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        mbs = self._micro_batches(seqs, self.train_cfg.micro_batch_tokens)
        step_fn = steps.train_step_fn(self.train_cfg, self.loss_fn, self.arch.vocab_size, denominator, len(mbs), self.dp_size)
        outputs = self._schedule(step_fn, mbs, forward_only=False)
        lr = float(self.optimizer.param_groups[0]["lr"])  # the rate this update used
        ok, grad_norm, _ = self.optimizer.step()
        if last_update:
            self.scheduler.step(increment=1)
            self.step += 1
        loss = float(sum(o["loss"] for o in outputs)) if outputs else 0.0
        return {"loss": sum(_share_all(loss)) / loss_scale, "grad_norm": float(grad_norm or 0.0), "update_ok": float(bool(ok)),
                "lr": lr, **_token_means(outputs)}


    def offload_for_generation(self, colocated: bool = True) -> dict[str, float]:
        """Before colocated engines wake: free the gradient buffer, move the optimizer state to
        host memory and empty the allocator cache, as ``training.offload_grads`` /
        ``offload_optimizer`` / ``empty_cache`` say for this placement. Returns GB of device
        memory reserved before and after (0 on CPU). The next update (or
        :meth:`reload_for_training`) brings everything back."""
        settings = self.train_cfg.memory_settings(colocated, self.model_cfg.tensor_parallel, platform.on_gpu())
        return offload_for_generation(self, settings)

    def reload_for_training(self) -> None:
        """Bring back what :meth:`offload_for_generation` moved; a no-op when nothing is away.
        ``train_local`` calls it first, so a driver that never offloads pays nothing."""
        reload_for_training(self)


# Per-token loss metrics (megatron_pc.algo.losses) reported as means over the update's tokens.
TOKEN_METRICS = ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "ratio_mean", "approx_kl", "entropy", "kl_loss", "tis_mean")


def _token_means(outputs: list[dict[str, Any]]) -> dict[str, float]:
    """Token-weighted means of the loss metrics over every micro-batch of every DP rank."""
    from megatron.core import parallel_state as ps

    local = {"tokens": 0.0}
    for out in outputs:
        local["tokens"] += out["tokens"]
        for key in TOKEN_METRICS:
            if key in out:
                local[key] = local.get(key, 0.0) + out[key] * out["tokens"]
    parts = _share({ps.get_data_parallel_rank(): local}, ps.get_data_parallel_world_size())
    tokens = sum(p["tokens"] for p in parts)
    keys = [k for k in TOKEN_METRICS if any(k in p for p in parts)]
    return {k: sum(p.get(k, 0.0) for p in parts) / tokens if tokens else 0.0 for k in keys}


def _share_all(value: float) -> list[float]:
    """``value`` of every DP rank's last pipeline stage (the sum is the global loss)."""
    from megatron.core import parallel_state as ps

    return [v for v in _share({ps.get_data_parallel_rank(): value}, ps.get_data_parallel_world_size())]
