"""Model FLOPs utilisation (MFU) of each phase of a step, and the device peaks it is measured against.

FLOPs are counted analytically from the model's shape (:class:`megatron_pc.models.shapes.ModelShape`):
* every token passes through every weight matrix once per forward pass: ``2 x P`` FLOPs, P the
  parameters of the Q/K/V/O projections, the SwiGLU MLP of every layer and the output layer
  (the input embedding is a lookup, norms are ignored);
* causal attention scores and weights each (query, key) pair once per layer: ``4 x layers x
  heads x head_dim`` FLOPs per pair; a sequence of T tokens has T^2 / 2 pairs, a generated token
  at context c has c;
* a training update is the forward pass and a backward pass of twice its cost (activation
  recomputation, when enabled, is not counted: MFU, not hardware FLOPs).

Per phase of a step, from its metrics: ``generate`` (the prefill of every request and every
decoded token: ``gen_prompt_tokens + generated_tokens`` tokens, ``gen_attention_pairs`` pairs),
``logprob`` and ``reference`` (a forward pass over ``trained_tokens`` / ``trained_attention_pairs``)
and ``update`` (three times that). MFU = FLOPs / (seconds x peak FLOP/s of the devices the phase
ran on).

Peaks: the dense bf16 tensor-core figures of the vendors' data sheets for GPUs (``PEAK_TFLOPS``);
on CPU a matmul probe measures what torch reaches on this machine's cores (:func:`cpu_peak_flops`).
"""

from __future__ import annotations

import time
from typing import Any

from megatron_pc.models.shapes import ModelShape

PEAK_TFLOPS: dict[str, float] = {
    # Dense bf16 tensor-core TFLOP/s (without sparsity), SXM parts, from the NVIDIA data sheets.
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
}


def matmul_params(shape: ModelShape) -> int:
    """Parameters every token is multiplied with in one forward pass (projections, MLP, output layer)."""
    q = shape.heads * shape.head_dim
    kv = shape.kv_heads * shape.head_dim
    per_layer = shape.hidden * (q + 2 * kv) + q * shape.hidden + 3 * shape.hidden * shape.intermediate
    return shape.layers * per_layer + shape.hidden * shape.vocab


def forward_flops(shape: ModelShape, tokens: float, attention_pairs: float) -> float:
    """FLOPs of a forward pass over ``tokens`` tokens whose attention scores ``attention_pairs`` pairs."""
    return 2.0 * matmul_params(shape) * tokens + 4.0 * shape.layers * shape.heads * shape.head_dim * attention_pairs


def step_flops(shape: ModelShape, row: dict[str, Any]) -> dict[str, float]:
    """FLOPs of each phase of one step (of megatron_pc.metrics.phases.FLOP_PHASES), from its
    metrics row (phases it did not run are left out)."""
    out: dict[str, float] = {}
    if row.get("generated_tokens") is not None and row.get("gen_attention_pairs") is not None:
        out["generate"] = forward_flops(shape, row.get("gen_prompt_tokens", 0) + row["generated_tokens"], row["gen_attention_pairs"])
    if row.get("trained_tokens"):
        forward = forward_flops(shape, row["trained_tokens"], row.get("trained_attention_pairs", 0.0))
        out["logprob"] = forward
        out["update"] = 3.0 * forward
        if row.get("time_reference"):
            out["reference"] = forward
    return out


def step_mfu(shape: ModelShape, row: dict[str, Any], peak_flops: float) -> dict[str, float]:
    """MFU of each phase of one step against ``peak_flops`` (FLOP/s of the phase's devices)."""
    out = {}
    for phase, flops in step_flops(shape, row).items():
        seconds = row.get(f"time_{phase}")
        if seconds:
            out[phase] = flops / (seconds * peak_flops)
    return out


def gpu_peak_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of one GPU by its name (``NVIDIA H200``), None if not in the table."""
    for key, tflops in PEAK_TFLOPS.items():
        if key in device_name.upper():
            return tflops * 1e12
    return None


def cpu_peak_flops(threads: int | None = None, size: int = 1024, seconds: float = 1.0) -> float:
    """FLOP/s that fp32 torch matmuls of ``size`` x ``size`` reach on ``threads`` threads (default:
    torch's own), the best of repeats over about ``seconds``: the CPU's practical peak."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        a = torch.randn(size, size)
        b = torch.randn(size, size)
        torch.matmul(a, b)  # warm-up
        best, end = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            torch.matmul(a, b)
            best = max(best, 2.0 * size**3 / (time.perf_counter() - start))
        return best
    finally:
        torch.set_num_threads(before)
