"""Jobs of the sequence-parallel tests, run inside spawned gloo processes (module level, so that
spawn can import them): build a tiny model at TP 2 with ``sequence_parallel`` and a given layer
spec, and run a log-prob, an update and an export through the real worker."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from megatron_pc.models.config import ModelConfig


def sp_model_cfg(path: Path, tp: int, pp: int = 1, **overrides: Any) -> ModelConfig:
    """fp32 model config for ``path`` (``layer_spec`` and the like through ``overrides``)."""
    return ModelConfig(**{"path": str(path), "tensor_parallel": tp, "pipeline_parallel": pp, "params_dtype": "float32", **overrides})


def job_build_reference(path: Path, tp: int, sequence_parallel: bool, layer_spec: str = "auto") -> str:
    """Build a ReferenceWorker; return the class of its first input norm, module and name."""
    from megatron_pc.training.parallel import init_parallel
    from megatron_pc.training.worker import ReferenceWorker

    logging.basicConfig(level=logging.WARNING)
    init_parallel(tp, 1, seed=1234)
    worker = ReferenceWorker(sp_model_cfg(path, tp, layer_spec=layer_spec), micro_batch_tokens=24,
                             sequence_parallel=sequence_parallel)
    return _qualname(worker.module.decoder.layers[0].input_layernorm)


NORM_SUFFIXES = ("layernorm.weight", "final_layernorm.weight")
"""Parameters every TP rank holds whole: the norms, whose gradient under sequence parallelism
is a sum over the TP ranks' sequence shards."""


def job_sp_run(path: Path, tp: int, pp: int, seqs: list, sequence_parallel: bool, layer_spec: str = "auto") -> dict[str, Any]:
    """Log-probs, one update, and an export: what a policy rank does in a step, at the given
    parallel sizes and layer spec. Returns (on every rank) the log-probs before, the update's loss
    and grad norm, this rank's norm gradients (fp32 main grads, after Megatron's finalize), the
    log-probs after, and on global rank 0 the exported HF tensors."""
    from megatron.core import parallel_state as ps

    from megatron_helpers import train_cfg
    from megatron_pc.models.export import iter_hf_tensors
    from megatron_pc.training.parallel import init_parallel
    from megatron_pc.training.worker import PolicyWorker

    logging.basicConfig(level=logging.WARNING)
    init_parallel(tp, pp, seed=1234)
    worker = PolicyWorker(sp_model_cfg(path, tp, pp, layer_spec=layer_spec), train_cfg(sequence_parallel=sequence_parallel))
    worker.load_hf()
    before = worker.compute_logprobs(seqs)
    for seq, (lp, _) in zip(seqs, before):
        seq.old_logprobs = lp.tolist()
    metrics = worker.train_step(seqs)
    norm_grads = {name: param.main_grad.detach().clone() for name, param in worker.module.named_parameters()
                  if name.endswith(NORM_SUFFIXES)}
    exported = {name: t.clone() for name, t in iter_hf_tensors(worker.module, worker.arch)}
    layer0 = worker.module.decoder.layers[0] if ps.is_pipeline_first_stage(ignore_virtual=True) else None
    return {"before": before, "loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "norm_grads": norm_grads,
            "after": worker.compute_logprobs(seqs), "exported": exported,
            "modules": None if layer0 is None else (_qualname(layer0.input_layernorm),
                                                    _qualname(layer0.self_attention.core_attention))}


def _qualname(module: Any) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def job_gpu_settings(path: Path, tp: int, pp: int, seqs: list, params_dtype: str, every_rank: bool) -> dict[str, Any]:
    """A policy rank's step at the settings a paper config resolves to on a GPU (colocated):
    sequence parallelism on, the layer spec ``auto`` resolves to (ours without TE), the
    distributed optimizer (DP > 1), offload before generation and reload for the update, the
    ``params_dtype`` given. Log-probs, offload, export (``every_rank``: the cuda_ipc sender's,
    each rank gathers within its TP group; else rank 0's, the object store's), reload, one
    update, log-probs again."""
    from megatron_helpers import train_cfg
    from megatron_pc.models.export import iter_hf_tensors
    from megatron_pc.training.parallel import init_parallel
    from megatron_pc.training.worker import PolicyWorker

    logging.basicConfig(level=logging.WARNING)
    init_parallel(tp, pp, seed=1234)
    cfg = train_cfg(sequence_parallel=True, offload_grads=True, offload_optimizer=True, empty_cache=True)
    worker = PolicyWorker(sp_model_cfg(path, tp, pp, params_dtype=params_dtype), cfg)
    worker.load_hf()
    before = worker.compute_logprobs(seqs)
    for seq, (lp, _) in zip(seqs, before):
        seq.old_logprobs = lp.tolist()
    worker.offload_for_generation(colocated=True)
    offloaded = sorted(worker._offloaded)
    pushed = {name: t.float().clone() for name, t in iter_hf_tensors(worker.module, worker.arch, every_rank=every_rank)}
    metrics = worker.train_step(seqs)
    return {"before": before, "after": worker.compute_logprobs(seqs), "loss": metrics["loss"], "offloaded": offloaded,
            "pushed": pushed,
            "optimizers": [type(o).__name__ for o in getattr(worker.optimizer, "chained_optimizers", [worker.optimizer])],
            "modules": _qualname(worker.module.decoder.layers[0].self_attention.core_attention)}
