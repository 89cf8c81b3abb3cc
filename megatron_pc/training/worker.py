"""Policy and reference workers over Megatron-Core: one per process, TP x PP x DP groups.

Every rank is handed the *global* batch; each DP rank works on its slice (``seqs[dp::DP]``)
and results come back, in input order, on every rank.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megatron_pc.models.config import ModelConfig
from megatron_pc.models.hf_config import HFArch, load_arch
from megatron_pc.models.hf_weights import load_hf_weights
from megatron_pc.training import steps
from megatron_pc.training.batching import MicroBatch, Sequence, micro_batches
from megatron_pc.training.config import TrainingConfig
from megatron_pc.training.setup import build_model, build_optimizer

logger = logging.getLogger(__name__)


def default_loss_fn() -> steps.LossFn:
    """The project's policy loss (megatron_pc.algo.losses.policy_loss)."""
    from megatron_pc.algo.losses import policy_loss

    return policy_loss


class ReferenceWorker:
    """A frozen model that computes per-token log-probs and entropy of responses."""

    trainable = False

    def __init__(self, model_cfg: ModelConfig, arch: HFArch | None = None, micro_batch_tokens: int = 4096) -> None:
        from megatron.core import parallel_state as ps

        self.model_cfg = model_cfg
        self.arch = arch or load_arch(model_cfg.path)
        self.micro_batch_tokens = micro_batch_tokens
        self.model = build_model(self.arch, model_cfg, trainable=self.trainable)
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

    def _local(self, seqs: list[Sequence]) -> list[int]:
        return list(range(self.dp_rank, len(seqs), self.dp_size))

    @torch.no_grad()
    def compute_logprobs(self, seqs: list[Sequence]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(log-probs, entropy) of each sequence's response tokens, on every rank."""
        local = self._local(seqs)
        mbs = micro_batches([seqs[i] for i in local], self.micro_batch_tokens)
        outputs = self._schedule(steps.logprob_step(self.arch.vocab_size), mbs, forward_only=True) if mbs else []
        mine: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for out in outputs:
            for row, i in enumerate(out["index"]):
                seq = seqs[local[i]]
                span = slice(seq.prompt_len - 1, len(seq.tokens) - 1)
                mine[local[i]] = (out["logprobs"][row, span].clone(), out["entropy"][row, span].clone())
        return _share(mine, len(seqs))


def _share(mine: dict[int, Any], total: int) -> list[Any]:
    """Results of the last pipeline stage of every DP rank, gathered on every rank."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() > 1:
        box = [mine]
        last = ps.get_pipeline_model_parallel_last_rank()
        dist.broadcast_object_list(box, src=last, group=ps.get_pipeline_model_parallel_group())
        mine = box[0]
    if ps.get_data_parallel_world_size() > 1:
        parts: list[dict[int, Any]] = [{} for _ in range(ps.get_data_parallel_world_size())]
        dist.all_gather_object(parts, mine, group=ps.get_data_parallel_group())
        mine = {k: v for part in parts for k, v in part.items()}
    return [mine[i] for i in range(total)]


class PolicyWorker(ReferenceWorker):
    """The trained model: log-probs, policy-loss train steps, checkpoints."""

    trainable = True

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainingConfig, arch: HFArch | None = None,
                 loss_fn: steps.LossFn | None = None) -> None:
        super().__init__(model_cfg, arch, train_cfg.micro_batch_tokens)
        self.train_cfg = train_cfg
        self.loss_fn = loss_fn or default_loss_fn()
        self.optimizer, self.scheduler = build_optimizer(self.model, model_cfg, train_cfg)
        self.step = 0

    def load_hf(self, model_dir: str | Path | None = None) -> None:
        """Load HF weights, then refresh the optimizer's copies of them (the distributed and
        mixed-precision optimizers keep fp32 main parameters)."""
        super().load_hf(model_dir)
        self.optimizer.reload_model_params()

    def _denominator(self, seqs: list[Sequence]) -> float:
        if self.train_cfg.loss_agg == "token-mean":
            return float(sum(s.response_len for s in seqs))
        return float(len(seqs))

    def train_step(self, seqs: list[Sequence]) -> dict[str, float]:
        """One optimizer step on the global batch ``seqs``; returns global metrics."""
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        mbs = micro_batches([seqs[i] for i in self._local(seqs)], self.train_cfg.micro_batch_tokens)
        step_fn = steps.train_step_fn(self.train_cfg, self.loss_fn, self.arch.vocab_size,
                                      self._denominator(seqs), len(mbs), self.dp_size)
        outputs = self._schedule(step_fn, mbs, forward_only=False)
        ok, grad_norm, _ = self.optimizer.step()
        self.scheduler.step(increment=1)
        self.step += 1
        loss = float(sum(o["loss"] for o in outputs)) if outputs else 0.0
        return {"loss": sum(_share_all(loss)), "grad_norm": float(grad_norm or 0.0), "update_ok": float(bool(ok)),
                "lr": float(self.optimizer.param_groups[0]["lr"])}


def _share_all(value: float) -> list[float]:
    """``value`` of every DP rank's last pipeline stage (the sum is the global loss)."""
    from megatron.core import parallel_state as ps

    return [v for v in _share({ps.get_data_parallel_rank(): value}, ps.get_data_parallel_world_size())]
