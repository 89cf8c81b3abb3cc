"""The memory model of ``megatron-pc plan``: the peak per GPU in each phase of a step, and the
host memory per node, as named terms with the formula or assumption behind each.

Units are GiB (2^30 bytes), against the total memory torch reports for the device
(``torch.cuda.get_device_properties(i).total_memory``, equal to nvidia-smi's memory.total), not
the marketing figure: an H200 "141 GB" reports 143,771 MiB = 140.4 GiB. A phase over
:data:`LIMIT` of that is refused: the rest is left to the caching allocator's fragmentation and
what this model does not count (activation gradients in flight, small buffers).

What the code holds, phase by phase (colocated: policy rank and vLLM worker share each GPU):

- policy update: bf16 weights; the fp32 gradient buffer (Megatron DDP, grad_reduce_in_fp32);
  Adam's fp32 master weights and two moments (/ DP with the distributed optimizer, on when
  DP > 1); activations of 1F1B (the first stage holds PP micro-batches of layers / PP layers,
  i.e. all layers' worth of one micro-batch); the logits: the output layer's bf16 logits and
  their bf16 gradient, whole, plus three fp32 temporaries of one log-prob chunk
  (megatron_pc/training/logprobs.py). The sleeping engine keeps its CUDA context.
- old log-probs: forward only: one layer's working set, the bf16 logits and the chunk's
  temporaries; gradients and optimizer state are still in host memory when offloaded (the first
  update brings them back).
- engines awake and generating: vLLM takes ``gpu_memory_utilization`` x the WHOLE device
  (weights, KV cache, activations, CUDA graphs and its context: vLLM's budget counts the
  process's non-torch memory). Beside it the policy keeps its weights, whatever was not
  offloaded, and, unless the allocator cache was emptied, everything it reserved in the update.
- weight sync: the above plus two buckets in flight (each at least ``rollout.sync_bucket_mb``
  and at least the largest unit, the embedding), held on the policy GPU as gathered tensors
  and one packed buffer, and received by the engine outside its budget.
- sync check: the generation phase plus a forward pass of the policy over one micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron_pc.models.shapes import ModelShape
from megatron_pc.rollout.config import SLEEP_LEVEL
from megatron_pc.training.logprobs import FP32_CHUNK_TEMPORARIES

GiB = 2**30
MiB = 2**20
LIMIT = 0.90
"""Largest share of the device (or of a node's host memory) a phase may take."""
POLICY_RUNTIME_GIB = 2.0
"""Assumed per policy process: CUDA context (~0.5 GiB), cuBLAS workspace, NCCL communicator
buffers of its TP / DP / PP groups."""
SLEEPING_ENGINE_GIB = 1.0
"""Assumed per vLLM worker asleep (weights and KV cache freed, rollout.config.SLEEP_LEVEL):
its CUDA context and the buffers sleep does not release."""
ENGINE_RESERVE_GIB = 2.0
"""Assumed inside vLLM's budget besides weights and KV cache: the profiled activation peak of
``max_num_batched_tokens`` and CUDA graphs."""
HOST_PROCESS_GIB = 4.0
"""Assumed host RSS of each policy rank or engine worker (Python, torch, CUDA and vLLM
libraries) beside what the terms count."""


@dataclass(frozen=True)
class Device:
    """A GPU as torch sees it."""

    name: str
    """Table key (``plan --device``)."""
    total_bytes: int
    """``torch.cuda.get_device_properties(i).total_memory``."""
    source: str
    """Where the figure comes from."""

    @property
    def total_gib(self) -> float:
        """Total memory in GiB."""
        return self.total_bytes / GiB


# nvidia-smi's memory.total, which CUDA (cudaMemGetInfo) and torch's total_memory report too.
# Published figures of each model's SXM part; not measured by this project (no GPU was lent).
DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device("H200", 143771 * MiB, "H200 SXM (\"141 GB\"): nvidia-smi memory.total 143771 MiB"),
        Device("H100", 81559 * MiB, "H100 SXM (\"80 GB\"): nvidia-smi memory.total 81559 MiB"),
        Device("A100-80GB", 81920 * MiB, "A100 SXM 80 GB: nvidia-smi memory.total 81920 MiB"),
        Device("A100-40GB", 40960 * MiB, "A100 SXM 40 GB: nvidia-smi memory.total 40960 MiB"),
    )
}
NOMINAL_GB = {141.0: "H200", 80.0: "H100", 40.0: "A100-40GB"}
"""cluster.gpu_memory_gb (the marketing figure) -> the device it names."""


def device_for(gpu_memory_gb: float, name: str | None = None) -> Device:
    """The device named ``name`` (a :data:`DEVICES` key), else the one whose marketing figure is
    ``gpu_memory_gb``, else a device of exactly ``gpu_memory_gb`` x 10^9 bytes."""
    if name is not None:
        if name not in DEVICES:
            raise ValueError(f"--device {name!r}: not one of {', '.join(DEVICES)}")
        return DEVICES[name]
    if gpu_memory_gb in NOMINAL_GB:
        return DEVICES[NOMINAL_GB[gpu_memory_gb]]
    return Device(f"{gpu_memory_gb:g} GB", int(gpu_memory_gb * 1e9), f"cluster.gpu_memory_gb={gpu_memory_gb:g} (10^9 bytes)")


@dataclass(frozen=True)
class Term:
    """One named amount of memory and how it was reckoned."""

    name: str
    gib: float
    how: str


@dataclass(frozen=True)
class Phase:
    """The memory of one phase on one kind of GPU (or of one node's host memory)."""

    name: str
    terms: tuple[Term, ...]

    @property
    def total(self) -> float:
        """GiB of all the terms."""
        return sum(t.gib for t in self.terms)


@dataclass(frozen=True)
class MemoryInputs:
    """Everything the model reads, from the experiment config and the layout."""

    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    engine_tensor_parallel: int
    gpu_memory_utilization: float
    micro_batch_tokens: int
    sequence_tokens: int
    colocated: bool
    params_bytes: int = 2
    distributed_optimizer: bool = True
    logprob_chunk_tokens: int | None = 1024
    sequence_parallel: bool = True
    offload_grads: bool = True
    offload_optimizer: bool = True
    empty_cache: bool = True
    sync_bucket_mb: int = 64
    reference_model: bool = False
    sleep_level: int = SLEEP_LEVEL
    layer_spec: str = "te"
    """The resolved layer spec (megatron_pc/models/layer_specs.py): ``te`` and ``sdpa`` keep no
    score matrix; ``local`` (Megatron's unfused attention) keeps [heads/TP, s, s] a row and layer."""

    @property
    def flash_attention(self) -> bool:
        """Attention keeps no score matrix (TE's flash attention, or torch SDPA in ours)."""
        return self.layer_spec != "local"


def _gib(n_bytes: float) -> float:
    return n_bytes / GiB


def local_params(model: ModelShape, m: MemoryInputs) -> float:
    """Parameters of the largest pipeline stage / TP (both vocabulary matrices at PP 1 untied)."""
    vocab_matrices = 2 if m.pipeline_parallel == 1 and not model.tied_embeddings else 1
    stage = math.ceil(model.layers / m.pipeline_parallel) * model.layer_params + vocab_matrices * model.embedding_params
    return stage / m.tensor_parallel


def padded_vocab(model: ModelShape, tp: int) -> int:
    """The vocabulary Megatron builds: a multiple of lcm(128, TP) (models/provider.py)."""
    multiple = math.lcm(128, tp)
    return -(-model.vocab // multiple) * multiple


def weights_term(model: ModelShape, m: MemoryInputs) -> Term:
    n = local_params(model, m)
    dtype = "bf16" if m.params_bytes == 2 else "fp32"
    return Term(f"policy weights ({dtype})", _gib(n * m.params_bytes), f"{n / 1e9:.3f}B local parameters x {m.params_bytes} B")


def grads_term(model: ModelShape, m: MemoryInputs) -> Term:
    n = local_params(model, m)
    return Term("policy gradient buffer (fp32)", _gib(n * 4), f"{n / 1e9:.3f}B x 4 B (grad_reduce_in_fp32)")


def optimizer_term(model: ModelShape, m: MemoryInputs) -> Term:
    n = local_params(model, m)
    per = (4 if m.params_bytes == 2 else 0) + 8
    shards = m.data_parallel if m.distributed_optimizer else 1
    how = f"{n / 1e9:.3f}B x {per} B (Adam {'fp32 master + ' if per == 12 else ''}2 fp32 moments) / {shards}"
    sharding = f"sharded over DP={shards}" if m.distributed_optimizer else "replicated"
    return Term(f"optimizer states ({sharding})", _gib(n * per / shards), how)


# Saved activations of one layer, measured with torch.autograd.graph.saved_tensors_hooks on the
# real Megatron layer (benchmarks/activations.py; pinned by tests/unit/test_activation_term.py),
# in values of each width a token keeps for the backward pass, at TP 1:
SP_VALUES = 4
"""Hidden-width values a token keeps, split by sequence parallelism: the inputs of the input norm,
the QKV projection, the pre-MLP norm and the first MLP projection."""
TP_VALUES = {"q": 4, "kv": 3, "i": 5}
"""Values a token keeps inside attention and the MLP, split by TP (heads, FFN columns), ours
(``sdpa``) and TE: the QKV projection's output (q + 2kv), the q-norm's input (q), q and k after
RoPE (q + kv), the attention output (q); the first MLP projection's output (2i), SiLU's output (i)
and the product (i), which the second projection keeps."""
LOCAL_TP_VALUES = {"q": 6, "kv": 2, "i": 5}
"""Megatron's local spec: its unfused attention keeps k and v repeated to every query head and
the attention output as a copy (q, q, q beside q after RoPE) instead of k after RoPE (kv)."""
FP32_ROW_VALUES = 4
"""Bytes of each norm's reciprocal rms: one fp32 a token for each of the two hidden norms
(split by SP) and one a head for the q- and k-norms (split by TP); SDPA's softmax statistics,
one fp32 a query head (split by TP)."""
ROPE_VALUES = 4
"""Head-dim values a token keeps per layer for RoPE (cos and sin, for q and for k), on every TP rank."""
SCORE_BYTES = 6
"""Bytes a score element keeps in Megatron's unfused attention (bf16): the probabilities (2 B)
and the fp32 softmax output (4 B); plus a causal mask of 1 B per [s, s] element, shared by the heads."""


def layer_bytes_per_token(hidden: int, q: int, kv: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                          spec: str, params_bytes: int, sp: int = 1, tp: int = 1) -> float:
    """Bytes one token keeps per layer for the backward pass (no recomputation), at SP / TP."""
    values = TP_VALUES if spec != "local" else LOCAL_TP_VALUES
    inside = values["q"] * q + values["kv"] * kv + values["i"] * intermediate
    rows = (2 / sp + (heads + kv_heads + (heads if spec != "local" else 0)) / tp) * FP32_ROW_VALUES
    return (SP_VALUES * hidden / sp + inside / tp + ROPE_VALUES * head_dim) * params_bytes + rows


def score_bytes(heads: int, tp: int, tokens: int, row: int) -> float:
    """Bytes Megatron's unfused attention keeps for ``tokens`` of rows of ``row`` tokens."""
    return tokens * row * (SCORE_BYTES * heads / tp + 1)


def predicted_layer_bytes(hidden: int, q: int, kv: int, intermediate: int, spec: str, params_bytes: int,
                          heads: int = 1, kv_heads: int = 1, head_dim: int = 128) -> dict[str, float]:
    """The model's figures at TP 1 for benchmarks/activations.py: bytes a token, and a score element."""
    per_token = layer_bytes_per_token(hidden, q, kv, intermediate, heads, kv_heads, head_dim, spec, params_bytes)
    return {"per_token": per_token, "per_score_element": (SCORE_BYTES + 1 / heads) if spec == "local" else 0.0}


def _per_token_layer_bytes(model: ModelShape, m: MemoryInputs) -> tuple[float, str]:
    """Bytes one token keeps per layer for the backward pass (no recomputation)."""
    tp = m.tensor_parallel
    q, kv = model.heads * model.head_dim, model.kv_heads * model.head_dim
    sp = tp if m.sequence_parallel and tp > 1 else 1
    per = layer_bytes_per_token(model.hidden, q, kv, model.intermediate, model.heads, model.kv_heads, model.head_dim,
                                m.layer_spec, m.params_bytes, sp, tp)
    v = TP_VALUES if m.layer_spec != "local" else LOCAL_TP_VALUES
    how = (f"({SP_VALUES}h/{sp} + ({v['q']}q + {v['kv']}kv + {v['i']}i)/{tp} + {ROPE_VALUES}d) x {m.params_bytes} B + fp32 "
           f"row statistics = {per / 1e3:.1f} kB a token a layer ({m.layer_spec} spec, "
           f"{'sequence parallel' if sp > 1 else 'no sequence parallelism'}, no recomputation; measured: "
           "benchmarks/activations.py)")
    return per, how


def activations_term(model: ModelShape, m: MemoryInputs, layers: int, label: str) -> list[Term]:
    """Activations of ``layers`` layers of one micro-batch (+ attention scores without flash)."""
    per, how = _per_token_layer_bytes(model, m)
    tokens = m.micro_batch_tokens
    terms = [Term(f"activations ({label})", _gib(tokens * layers * per), f"{tokens} tokens x {layers} layer(s) x {how}")]
    if not m.flash_attention:
        # Unfused attention keeps the scores and the softmax, [heads/TP, s, s] per row and layer:
        # at most tokens x the longest row (rollout.max_model_len) per micro-batch.
        row = min(tokens, m.sequence_tokens)
        scores = score_bytes(model.heads, m.tensor_parallel, tokens, row)
        terms.append(Term(f"attention scores ({label}, unfused: layer_spec local)", _gib(scores * layers),
                          f"{tokens} tokens x {row} x ({SCORE_BYTES} B x {model.heads}/{m.tensor_parallel} heads + 1 B mask) "
                          f"x {layers} layers (measured: benchmarks/activations.py)"))
    return terms


def logits_terms(model: ModelShape, m: MemoryInputs, tokens: int, with_grad: bool) -> list[Term]:
    """The output layer's logits (and gradient) whole, and one chunk's fp32 temporaries."""
    vocab = padded_vocab(model, m.tensor_parallel) / m.tensor_parallel
    copies = 2 if with_grad else 1
    chunk = min(m.logprob_chunk_tokens or tokens, tokens)
    return [
        Term("logits" + (" + their gradient" if with_grad else ""), _gib(copies * tokens * vocab * m.params_bytes),
             f"{copies} x {tokens} tokens x {vocab:.0f} vocabulary columns a TP rank x {m.params_bytes} B"),
        Term("log-prob chunk temporaries (fp32)", _gib(FP32_CHUNK_TEMPORARIES * chunk * vocab * 4),
             f"{FP32_CHUNK_TEMPORARIES} x {chunk} tokens (training.logprob_chunk_tokens) x {vocab:.0f} x 4 B"),
    ]


def reference_term(model: ModelShape, m: MemoryInputs) -> list[Term]:
    if not m.reference_model:
        return []
    n = local_params(model, m)
    return [Term("reference model (kl_coef > 0)", _gib(n * m.params_bytes) + POLICY_RUNTIME_GIB,
                 f"its own process: {n / 1e9:.3f}B x {m.params_bytes} B + {POLICY_RUNTIME_GIB:g} GiB runtime")]


def _runtime() -> Term:
    return Term("policy runtime", POLICY_RUNTIME_GIB, "assumed: CUDA context, cuBLAS workspace, NCCL buffers")


def _sleeping_engine(m: MemoryInputs) -> list[Term]:
    if not m.colocated:
        return []
    return [Term("vLLM worker asleep", SLEEPING_ENGINE_GIB, f"assumed: its CUDA context (sleep level {m.sleep_level} frees weights and KV cache)")]


def policy_update(model: ModelShape, m: MemoryInputs) -> Phase:
    """Forward and backward of one micro-batch with everything the update keeps."""
    # 1F1B: the first stage holds PP micro-batches of layers / PP layers: all layers' worth.
    layers = math.ceil(model.layers / m.pipeline_parallel) * m.pipeline_parallel
    terms = [weights_term(model, m), grads_term(model, m), optimizer_term(model, m),
             *activations_term(model, m, layers, f"{layers} layers, 1F1B"),
             *logits_terms(model, m, m.micro_batch_tokens, with_grad=True), _runtime(),
             *reference_term(model, m), *_sleeping_engine(m)]
    return Phase("policy update", tuple(terms))


def _held(model: ModelShape, m: MemoryInputs, while_what: str) -> list[Term]:
    """Gradient buffer and optimizer state unless offloaded before generation."""
    terms = []
    if not (m.colocated and m.offload_grads):
        terms.append(grads_term(model, m))
    if not (m.colocated and m.offload_optimizer and m.params_bytes == 2):
        terms.append(optimizer_term(model, m))
    if m.colocated and (m.offload_grads or m.offload_optimizer):
        away = " and ".join(n for n, on in (("gradients", m.offload_grads), ("optimizer state", m.offload_optimizer)) if on)
        terms.append(Term(f"{away} in host memory {while_what}", 0.0, "training.offload_grads / offload_optimizer"))
    return terms


def old_logprobs(model: ModelShape, m: MemoryInputs) -> Phase:
    """Forward only: the update's state is still where generation left it."""
    terms = [weights_term(model, m), *_held(model, m, "(back at the first update)"),
             *activations_term(model, m, 1, "forward only, one layer"),
             *logits_terms(model, m, m.micro_batch_tokens, with_grad=False), _runtime(),
             *reference_term(model, m), *_sleeping_engine(m)]
    return Phase("old log-probs", tuple(terms))


def _policy_beside_engines(model: ModelShape, m: MemoryInputs) -> list[Term]:
    """What the policy process holds on a colocated GPU while the engines are awake."""
    if m.colocated and not m.empty_cache:
        update = policy_update(model, m)
        kept = sum(t.gib for t in update.terms if t.name != "vLLM worker asleep")
        return [Term("policy reserved at the update's peak", kept,
                     "training.empty_cache off: the caching allocator keeps every block the update used")]
    return [weights_term(model, m), *_held(model, m, "(offloaded)"), _runtime(), *reference_term(model, m)]


def engine_budget(m: MemoryInputs, total_gib: float) -> Term:
    return Term("vLLM (gpu_memory_utilization x whole device)", m.gpu_memory_utilization * total_gib,
                f"{m.gpu_memory_utilization} x {total_gib:.1f} GiB: weights, KV cache, activations, graphs, context")


def sync_units(model: ModelShape) -> list[int]:
    """Bytes (bf16) of the units a sync streams, in export order: the embedding, each decoder
    layer, the final norm, the output layer when untied (weight_sync/buckets.py: weight_unit)."""
    output = [] if model.tied_embeddings else [model.embedding_params * 2]
    return [model.embedding_params * 2, *[model.layer_params * 2] * model.layers, model.hidden * 2, *output]


def sync_buckets(model: ModelShape, bucket_mb: int) -> list[int]:
    """Bytes of each bucket ``buckets.buckets_by_layer`` cuts at ``bucket_mb``: a bucket closes
    at the first unit boundary once it holds ``bucket_mb``, so it may exceed it by one unit."""
    out, size = [], 0
    for unit in sync_units(model):
        if size >= bucket_mb * MiB:
            out.append(size)
            size = 0
        size += unit
    return out + ([size] if size else [])


def bucket_mb_within_largest_unit(model: ModelShape) -> int:
    """The largest ``rollout.sync_bucket_mb`` whose buckets are no larger than the largest unit
    (the embedding), which sizes the sync's buffers anyway: that unit less one decoder layer
    (a bucket closes once it holds the size, at most one layer later). Fewer buckets at no
    memory cost: each bucket pays a fixed overhead (launch/refit.py: BUCKET_LATENCY_S)."""
    return int((max(sync_units(model)) - model.layer_params * 2) // MiB)


def bucket_gib(model: ModelShape, m: MemoryInputs) -> float:
    """The largest weight-sync bucket: ``sync_bucket_mb`` closed at a unit boundary, at least
    the largest unit (the embedding, gathered whole in HF layout)."""
    return max(sync_buckets(model, m.sync_bucket_mb)) / GiB


def sync_buffers(model: ModelShape, m: MemoryInputs, side: str) -> Term:
    bucket = bucket_gib(model, m)
    if side == "policy":
        return Term("weight-sync send buffers", 4 * bucket,
                    f"2 buckets in flight x (gathered tensors + packed buffer) x {bucket:.2f} GiB")
    return Term("weight-sync receive buffers (outside vLLM's budget)", 2 * bucket, f"2 buckets in flight x {bucket:.2f} GiB")


def colocated_phases(model: ModelShape, m: MemoryInputs, total_gib: float) -> list[Phase]:
    """The five phases of a step on a GPU that both the policy and an engine use."""
    beside = _policy_beside_engines(model, m)
    engines = engine_budget(m, total_gib)
    forward = [*activations_term(model, m, 1, "sync-check forward, one layer"),
               *logits_terms(model, m, m.micro_batch_tokens, with_grad=False)]
    return [
        policy_update(model, m),
        old_logprobs(model, m),
        Phase("engines awake, generating", (*beside, engines)),
        Phase("weight sync", (*beside, engines, sync_buffers(model, m, "policy"), sync_buffers(model, m, "engine"))),
        Phase("sync check", (*beside, engines, *forward)),
    ]


def split_phases(model: ModelShape, m: MemoryInputs, total_gib: float) -> list[Phase]:
    """Policy GPUs and engine GPUs apart: each kind's phases."""
    resident = [weights_term(model, m), grads_term(model, m), optimizer_term(model, m), _runtime(), *reference_term(model, m)]
    forward = [*activations_term(model, m, 1, "forward, one layer"), *logits_terms(model, m, m.micro_batch_tokens, with_grad=False)]
    engines = engine_budget(m, total_gib)
    return [
        policy_update(model, m),
        old_logprobs(model, m),
        Phase("weight sync (policy GPU)", (*resident, sync_buffers(model, m, "policy"))),
        Phase("sync check (policy GPU)", (*resident, *forward)),
        Phase("engines generating (engine GPU)", (engines,)),
        Phase("weight sync (engine GPU)", (engines, sync_buffers(model, m, "engine"))),
    ]


def host_phase(model: ModelShape, m: MemoryInputs, gpus_per_node: int, policy_gpus_per_node: int,
               engine_gpus_per_node: int) -> Phase:
    """Host memory of one node while its engines sleep (the policy update)."""
    terms = [Term("processes", (policy_gpus_per_node + engine_gpus_per_node) * HOST_PROCESS_GIB,
                  f"{policy_gpus_per_node + engine_gpus_per_node} processes x {HOST_PROCESS_GIB:g} GiB (assumed)")]
    if m.colocated and m.sleep_level == 1:  # level 2 keeps no copy (rollout.config.SLEEP_LEVEL)
        per_gpu = model.total_params * 2 / m.engine_tensor_parallel
        terms.append(Term("vLLM weights asleep (pinned)", _gib(per_gpu * engine_gpus_per_node),
                          f"{engine_gpus_per_node} engine GPUs x {_gib(per_gpu):.2f} GiB (bf16 weights / engine TP); sleep level 1"))
    if m.colocated and m.offload_optimizer and m.params_bytes == 2:
        opt = optimizer_term(model, m)
        terms.append(Term("optimizer state offloaded (while generating)", opt.gib * policy_gpus_per_node,
                          f"{policy_gpus_per_node} policy GPUs x {opt.gib:.2f} GiB"))
    return Phase("host memory per node", tuple(terms))


def kv_cache_tokens(model: ModelShape, m: MemoryInputs, total_gib: float) -> tuple[float, float, int]:
    """(vLLM weights GiB per GPU, KV-cache GiB per GPU, KV tokens per engine)."""
    weights = _gib(model.total_params * 2 / m.engine_tensor_parallel)
    kv = max(0.0, m.gpu_memory_utilization * total_gib - weights - ENGINE_RESERVE_GIB)
    kv_heads_per_gpu = max(1, model.kv_heads // m.engine_tensor_parallel)
    per_token = 2 * model.layers * kv_heads_per_gpu * model.head_dim * 2
    return weights, kv, int(kv * GiB // per_token)
