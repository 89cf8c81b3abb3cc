"""``megatron-pc bench activations``: the bytes one transformer layer keeps for its backward pass,
measured on the real Megatron layer with ``torch.autograd.graph.saved_tensors_hooks``.

One layer (Megatron's ``TransformerLayer`` from the layer spec the run builds, RoPE applied as in
the model) runs forward on sequences of a few lengths in one process (TP 1). Every tensor autograd
saves is recorded once per storage (q, k and v that are views of one projection count once),
parameters left out, and put in one of three groups:

- ``sp``: saved inside the input norm, the pre-MLP norm, the QKV projection or the first MLP
  projection: hidden-width inputs, which sequence parallelism splits over TP (Megatron's
  column-parallel linears keep the un-gathered input under SP);
- ``tp``: everything else per token (q/k norms, RoPE, core attention's q, k, v and output,
  the attention output, the SwiGLU input and product): split over TP by heads or FFN columns;
- ``score``: tensors whose last two dimensions are the sequence length twice (the unfused
  attention's scores and probabilities): bytes per score element, heads x s^2 a row.

The bytes per token of the ``sp`` and ``tp`` groups are fitted over the lengths (least squares
with the score elements), then per token and per layer in values of each width
(:func:`megatron_pc.launch.memory_model.activation_coefficients` reads them in that form).
``--widths 14b`` is Qwen3-14B (hidden 5120, FFN 17408, 40 query / 8 KV heads of 128, qk-norm).

Transformer Engine cannot run on CPU, so ``te`` is not measured here: its fused LayerNormLinear
keeps the norm's input and output (the local spec keeps the norm's input and the linear's input,
the same two hidden-width tensors), and its flash attention keeps q, k, v, the output and the
softmax statistics, as torch's SDPA does (``sdpa``); the memory model takes ``sdpa``'s figures
for ``te``. tests/gpu/test_activations_gpu.py checks the figure against
``torch.cuda.max_memory_allocated`` on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch

SP_MODULES = ("input_layernorm", "pre_mlp_layernorm", "linear_qkv", "linear_fc1")
"""Submodules whose saved tensors are hidden-width inputs, split by sequence parallelism."""

WIDTHS = {
    "14b": dict(hidden=5120, intermediate=17408, heads=40, kv_heads=8, head_dim=128),
    "small": dict(hidden=256, intermediate=704, heads=4, kv_heads=2, head_dim=64),
}
"""Named width sets: Qwen3-14B's, and a small one for the unit test."""


@dataclass(frozen=True)
class Widths:
    """The widths of one layer."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def q(self) -> int:
        """Query width: heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        """Key (or value) width: KV heads x head_dim."""
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class Measurement:
    """Saved bytes of one layer's forward over one sequence, by group."""

    tokens: int
    score_elements: int
    sp: int
    tp: int
    score: int


@dataclass(frozen=True)
class Fit:
    """Per token per layer (sp, tp) and per score element, from several lengths."""

    spec: str
    dtype: str
    widths: Widths
    sp_bytes_per_token: float
    tp_bytes_per_token: float
    bytes_per_score_element: float
    measurements: tuple[Measurement, ...]

    @property
    def bytes_per_token(self) -> float:
        """Both per-token groups at TP 1."""
        return self.sp_bytes_per_token + self.tp_bytes_per_token


def _init_single_process() -> None:
    """A world of one (gloo or NCCL) with Megatron's groups at TP = PP = 1."""
    import torch.distributed as dist

    from megatron_pc import platform
    from megatron_pc.training.launch import free_port
    from megatron_pc.training.parallel import init_parallel

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group(platform.dist_backend(), rank=0, world_size=1)
        init_parallel(1, 1)


def build_layer(widths: Widths, spec: str, dtype: torch.dtype):  # -> (TransformerLayer, RotaryEmbedding)
    """One Megatron TransformerLayer of ``spec`` (resolved name) at ``widths``, with qk-norm,
    plus the rotary embedding the model would apply."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer.spec_utils import build_module

    from megatron_pc import platform
    from megatron_pc.models.hf_config import FAMILIES, HFArch
    from megatron_pc.models.layer_specs import layer_spec
    from megatron_pc.models.provider import transformer_config

    _init_single_process()
    arch = HFArch(family=FAMILIES["qwen3"], vocab_size=128, hidden_size=widths.hidden, intermediate_size=widths.intermediate,
                  num_layers=1, num_heads=widths.heads, num_kv_heads=widths.kv_heads, head_dim=widths.head_dim,
                  rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling_factor=None, tie_embeddings=False,
                  max_position_embeddings=4096)
    config = transformer_config(arch, 1, 1, dtype)
    layer = build_module(layer_spec(spec, qk_norm=True), config=config, layer_number=1)
    rope = RotaryEmbedding(kv_channels=widths.head_dim, rotary_percent=1.0, rotary_base=1_000_000)
    if platform.on_gpu():
        layer, rope = layer.cuda(), rope.cuda()
    return layer, rope


@contextmanager
def _module_names(root: torch.nn.Module) -> Iterator[list[str]]:
    """The names of the submodules running now, innermost last."""
    stack: list[str] = []
    handles = []

    def enter(leaf: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any) -> None:
            stack.append(leaf)
        return hook

    def leave(module: torch.nn.Module, args: Any, output: Any) -> None:
        stack.pop()  # returns None: a forward hook's return value would replace the output

    for name, module in root.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(enter(name.rsplit(".", 1)[-1])))
            handles.append(module.register_forward_hook(leave))
    try:
        yield stack
    finally:
        for handle in handles:
            handle.remove()


def measure(layer: torch.nn.Module, rope: torch.nn.Module, widths: Widths, tokens: int, dtype: torch.dtype) -> Measurement:
    """Saved bytes of ``layer``'s forward over one sequence of ``tokens`` (batch 1)."""
    device = next(layer.parameters()).device
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen: set[int] = set()
    groups = {"sp": 0, "tp": 0, "score": 0}

    with _module_names(layer) as running:
        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in params or ptr in seen or storage.nbytes() == 0:
                return t
            seen.add(ptr)
            if t.dim() >= 2 and t.shape[-1] == tokens and t.shape[-2] == tokens:
                groups["score"] += storage.nbytes()
            elif any(name in SP_MODULES for name in running[-1:]):
                groups["sp"] += storage.nbytes()
            else:
                groups["tp"] += storage.nbytes()
            return t

        x = torch.randn(tokens, 1, widths.hidden, dtype=dtype, device=device, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out, _ = layer(x, attention_mask=None, rotary_pos_emb=rope(tokens))
    del out
    return Measurement(tokens, widths.heads * tokens * tokens, groups["sp"], groups["tp"], groups["score"])


def fit_layer(widths: Widths, spec: str = "local", lengths: tuple[int, ...] = (24, 40, 56),
              dtype: torch.dtype = torch.bfloat16) -> Fit:
    """Measure ``spec`` at ``widths`` over ``lengths`` and fit the per-token and per-score terms."""
    layer, rope = build_layer(widths, spec, dtype)
    layer.train()
    rows = [measure(layer, rope, widths, s, dtype) for s in lengths]
    tokens = torch.tensor([float(r.tokens) for r in rows])

    def per_token(values: list[int]) -> float:
        # Least squares through the origin: bytes = per_token x tokens.
        return float((tokens * torch.tensor([float(v) for v in values])).sum() / (tokens * tokens).sum())

    elements = torch.tensor([float(r.score_elements) for r in rows])
    score = float((elements * torch.tensor([float(r.score) for r in rows])).sum() / (elements * elements).sum())
    return Fit(spec, str(dtype).removeprefix("torch."), widths, per_token([r.sp for r in rows]), per_token([r.tp for r in rows]),
               score, tuple(rows))


def main(argv: list[str] | None = None) -> int:
    """Print the fit for each spec at the named widths (as JSON with ``--json``)."""
    parser = argparse.ArgumentParser(prog="megatron-pc bench activations", description=__doc__.splitlines()[0])
    parser.add_argument("--widths", choices=sorted(WIDTHS), default="14b")
    parser.add_argument("--spec", action="append", choices=("local", "sdpa"), help="layer spec(s) (default: both)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[24, 40, 56])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from megatron_pc.launch.memory_model import predicted_layer_bytes

    widths = Widths(**WIDTHS[args.widths])
    for spec in args.spec or ["local", "sdpa"]:
        fit = fit_layer(widths, spec, tuple(args.lengths))
        predicted = predicted_layer_bytes(widths.hidden, widths.q, widths.kv, widths.intermediate, spec, 2,
                                          widths.heads, widths.kv_heads, widths.head_dim)
        if args.json:
            print(json.dumps({**asdict(fit), "predicted": predicted}))
            continue
        print(f"{spec} spec, {args.widths} widths {widths}, {fit.dtype}, TP 1, lengths {args.lengths}:")
        for r in fit.measurements:
            print(f"  {r.tokens:4d} tokens: sp {r.sp:>12,} B  tp {r.tp:>12,} B  scores {r.score:>12,} B")
        print(f"  per token per layer: {fit.bytes_per_token:,.0f} B (sp group {fit.sp_bytes_per_token:,.0f} = "
              f"{fit.sp_bytes_per_token / widths.hidden / 2:.2f} hidden-width values; tp group {fit.tp_bytes_per_token:,.0f}); "
              f"per score element {fit.bytes_per_score_element:.3f} B")
        print(f"  memory model: {predicted['per_token']:,.0f} B a token, {predicted['per_score_element']:.3f} B a score element")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def fit_in_fresh_process(widths: Widths, specs: tuple[str, ...]) -> list[Fit]:
    """:func:`fit_layer` for each spec in a spawned process of its own (its process group and
    Megatron's groups do not outlive it)."""
    from megatron_pc.training.launch import run_distributed

    return run_distributed(_fit_job, 1, widths, specs, timeout_s=600)[0]


def _fit_job(widths: Widths, specs: tuple[str, ...]) -> list[Fit]:
    from megatron_pc.training.parallel import init_parallel

    init_parallel(1, 1)
    return [fit_layer(widths, spec) for spec in specs]
