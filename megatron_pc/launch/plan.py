"""``megatron-pc plan``: check that a layout fits the cluster before a job is submitted.

:func:`plan_layout` is pure: from a model shape and a :class:`Layout` it checks that the policy
(Megatron TP x PP x DP) and the vLLM engines (engines x engine TP) fit the GPUs and divide the
model, and estimates memory per GPU. :func:`main` reads the project config and prints the plan.

Memory model (GB = 10^9 bytes; an estimate to catch layouts that cannot work, not a profiler):

- policy weights: the parameters of the largest pipeline stage / TP, in ``params_dtype``
  (``auto`` plans as bf16, the GPU default). A stage holds layers / PP layers plus one
  vocabulary matrix (both embedding and output layer when PP = 1 and they are not tied).
- gradients: Megatron's fp32 main-grad buffer, 4 bytes per local parameter.
- optimizer: Adam fp32 master weights (bf16 params only) + 2 fp32 moments, 12 (or 8) bytes
  per local parameter, divided by DP with the distributed optimizer.
- activations: per token and layer, with flash attention, no recomputation and sequence
  parallelism (TP > 1), the layer keeps about ``4h + 2q + 2kv + 3i`` bf16 values (norm
  inputs and outputs, Q/K/V, attention output, SwiGLU gate/up/product; h hidden, q and kv
  the query and key/value widths, i the MLP width) / TP, close to the 34h bytes of Korthikanti
  et al. 2022 for a 4h MLP. With 1F1B the first stage holds PP micro-batches of layers / PP
  layers, i.e. all layers' worth; so: micro_batch_tokens x layers x per-layer bytes.
- logits: micro_batch_tokens x vocab / TP x 6 bytes (bf16 logits and their fp32 log-softmax).
- runtime: a fixed 4 GB for the CUDA context, NCCL buffers and allocator slack.
- vLLM: ``gpu_memory_utilization`` x GPU memory per engine GPU: bf16 weights / engine TP, the
  rest KV cache (2 x layers x KV heads per GPU x head_dim x 2 bytes per token).

Colocated: policy and engines share every GPU; engines sleep (weights offloaded, KV cache
freed) during training, the policy stays resident during generation, so both phases are
checked. Split: policy GPUs and engine GPUs are disjoint pools, each checked on its own.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from megatron_pc.launch.models_table import ModelShape, load_model_shape


GB = 1e9
RUNTIME_OVERHEAD_GB = 4.0
"""CUDA context, NCCL buffers and allocator slack per GPU process (approximate)."""
CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"


@dataclass(frozen=True)
class Layout:
    """How one experiment is spread over the cluster: everything :func:`plan_layout` checks."""

    nodes: int
    """SLURM nodes."""
    gpus_per_node: int
    """GPUs on each node."""
    gpu_memory_gb: float
    """Memory of one GPU in GB (141: H200)."""
    placement: str
    """``colocated`` (policy and engines on every GPU) or ``split`` (disjoint pools)."""
    tensor_parallel: int
    """Policy TP."""
    pipeline_parallel: int
    """Policy PP."""
    data_parallel: int
    """Policy DP."""
    engines: int
    """vLLM engines."""
    engine_tensor_parallel: int
    """TP of each engine."""
    gpu_memory_utilization: float
    """vLLM's fraction of a GPU's memory."""
    micro_batch_tokens: int
    """Token budget of one training micro-batch."""
    sequence_tokens: int
    """Longest sequence an engine holds: prompt + response tokens (rollout.max_model_len)."""
    params_bytes: int = 2
    """Bytes per policy parameter (2 bf16, 4 fp32)."""
    distributed_optimizer: bool = True
    """Optimizer states sharded over DP (Megatron's distributed optimizer)."""

    @property
    def gpus(self) -> int:
        """GPUs in the cluster."""
        return self.nodes * self.gpus_per_node

    @property
    def policy_gpus(self) -> int:
        """GPUs of the policy: TP x PP x DP."""
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel

    @property
    def engine_gpus(self) -> int:
        """GPUs of the engines: engines x engine TP."""
        return self.engines * self.engine_tensor_parallel


@dataclass
class MemoryColumn:
    """Memory of one kind of GPU (or one phase on shared GPUs): named terms in GB."""

    name: str
    """``training phase`` / ``generation phase`` (colocated), ``policy GPU`` / ``engine GPU`` (split)."""
    terms: dict[str, float] = field(default_factory=dict)
    """Term description -> GB per GPU."""

    @property
    def total(self) -> float:
        """Sum of the terms in GB."""
        return sum(self.terms.values())


@dataclass
class PlanReport:
    """Result of :func:`plan_layout`: the layout, per-GPU memory, and why it is refused if it is."""

    model: ModelShape
    """The model planned for."""
    layout: Layout
    """The layout checked."""
    columns: list[MemoryColumn]
    """Memory per GPU, one column per kind of GPU or phase."""
    kv_cache_tokens: int
    """Tokens the KV cache of one engine holds (0 when the weights do not fit)."""
    problems: list[str]
    """Each reason the layout cannot run; empty when it fits."""

    @property
    def fits(self) -> bool:
        """True when nothing stops the layout."""
        return not self.problems


def check_divisibility(model: ModelShape, layout: Layout) -> list[str]:
    """Sizes that must divide: policy TP into heads and KV heads, PP into layers, engine TP
    into heads (vLLM replicates KV heads when engine TP exceeds them); TP within one node."""
    problems = []
    tp, pp, etp = layout.tensor_parallel, layout.pipeline_parallel, layout.engine_tensor_parallel
    if model.heads % tp:
        problems.append(f"model.tensor_parallel={tp} does not divide the {model.heads} attention heads of {model.name}")
    if model.kv_heads % tp:
        problems.append(f"model.tensor_parallel={tp} does not divide the {model.kv_heads} KV heads of {model.name}")
    if model.layers % pp:
        problems.append(f"model.pipeline_parallel={pp} does not divide the {model.layers} layers of {model.name}")
    if model.heads % etp:
        problems.append(f"rollout.tensor_parallel={etp} does not divide the {model.heads} attention heads of {model.name}")
    if model.kv_heads % etp and etp % model.kv_heads:
        problems.append(f"rollout.tensor_parallel={etp} neither divides nor is a multiple of the {model.kv_heads} KV heads of {model.name}")
    # TP all-reduces every layer; over the inter-node network that is far too slow.
    for name, size in (("model.tensor_parallel", tp), ("rollout.tensor_parallel", etp)):
        if size > layout.gpus_per_node:
            problems.append(f"{name}={size} spans more than one node ({layout.gpus_per_node} GPUs per node)")
    return problems


def check_gpu_counts(layout: Layout) -> list[str]:
    """Policy and engines must cover every GPU when colocated, and share them when split."""
    policy = (
        f"policy TP x PP x DP = {layout.tensor_parallel} x {layout.pipeline_parallel} x "
        f"{layout.data_parallel} = {layout.policy_gpus} GPUs"
    )
    engines = f"engines x engine TP = {layout.engines} x {layout.engine_tensor_parallel} = {layout.engine_gpus} GPUs"
    have = f"the cluster has {layout.nodes} x {layout.gpus_per_node} = {layout.gpus}"
    if layout.placement == "colocated":
        problems = []
        if layout.policy_gpus != layout.gpus:
            problems.append(f"colocated: {policy}, but {have} (set cluster.data_parallel)")
        if layout.engine_gpus != layout.gpus:
            problems.append(f"colocated: {engines}, but {have} (set rollout.engines)")
        return problems
    if layout.policy_gpus + layout.engine_gpus > layout.gpus:
        return [f"split: {policy} + {engines} = {layout.policy_gpus + layout.engine_gpus} GPUs, but {have}"]
    return []


def policy_memory(model: ModelShape, layout: Layout) -> tuple[dict[str, float], dict[str, float]]:
    """Per-GPU memory of the policy in GB: (resident terms, terms only while training)."""
    tp, pp, dp = layout.tensor_parallel, layout.pipeline_parallel, layout.data_parallel
    vocab_matrices = 2 if pp == 1 and not model.tied_embeddings else 1
    stage_params = math.ceil(model.layers / pp) * model.layer_params + vocab_matrices * model.embedding_params
    local = stage_params / tp
    dtype = "bf16" if layout.params_bytes == 2 else "fp32"
    master = 4 if layout.params_bytes == 2 else 0
    shards = dp if layout.distributed_optimizer else 1
    sharding = f"sharded over DP={dp}" if layout.distributed_optimizer else "replicated, not distributed"
    resident = {
        f"policy weights ({dtype})": local * layout.params_bytes / GB,
        "policy gradients (fp32 main grads)": local * 4 / GB,
        f"optimizer states (Adam fp32 master + 2 moments, {sharding})": local * (master + 8) / shards / GB,
        "runtime (CUDA context, NCCL, slack)": RUNTIME_OVERHEAD_GB,
    }
    q, kv = model.heads * model.head_dim, model.kv_heads * model.head_dim
    per_token_layer = 2 * (4 * model.hidden + 2 * q + 2 * kv + 3 * model.intermediate) / tp
    tokens = layout.micro_batch_tokens
    training = {
        f"activations ({tokens} tokens x {model.layers} layers)": tokens * model.layers * per_token_layer / GB,
        "logits (bf16 + fp32 log-softmax)": tokens * model.vocab / tp * 6 / GB,
    }
    return resident, training


def engine_memory(model: ModelShape, layout: Layout) -> tuple[dict[str, float], int, list[str]]:
    """Per-GPU memory of a vLLM engine in GB, the KV-cache tokens per engine, and problems."""
    etp = layout.engine_tensor_parallel
    budget = layout.gpu_memory_utilization * layout.gpu_memory_gb
    weights = model.total_params * 2 / etp / GB
    kv_heads_per_gpu = max(1, model.kv_heads // etp)
    kv_bytes_per_token = 2 * model.layers * kv_heads_per_gpu * model.head_dim * 2
    kv = max(0.0, budget - weights)
    tokens = int(kv * GB // kv_bytes_per_token)
    problems = []
    if weights >= budget:
        problems.append(
            f"vLLM weights ({weights:.1f} GB per GPU at engine TP={etp}) do not fit in rollout.gpu_memory_utilization="
            f"{layout.gpu_memory_utilization} x {layout.gpu_memory_gb:g} GB = {budget:.1f} GB"
        )
    elif tokens < layout.sequence_tokens:
        problems.append(
            f"vLLM KV cache holds {tokens} tokens per engine, fewer than one sequence of "
            f"rollout.max_model_len={layout.sequence_tokens} tokens (vLLM refuses to start)"
        )
    terms = {f"vLLM weights (bf16, engine TP={etp})": weights, "vLLM KV cache": kv}
    return terms, tokens, problems


def check_memory(columns: list[MemoryColumn], gpu_memory_gb: float) -> list[str]:
    """A column over the GPU memory is refused, naming its largest term."""
    problems = []
    for column in columns:
        if column.total > gpu_memory_gb:
            term, size = max(column.terms.items(), key=lambda kv: kv[1])
            problems.append(
                f"{column.name}: {column.total:.1f} GB per GPU does not fit in {gpu_memory_gb:g} GB; "
                f"largest term: {term} = {size:.1f} GB"
            )
    return problems


def plan_layout(model: ModelShape, layout: Layout) -> PlanReport:
    """Check ``layout`` for ``model`` and estimate memory per GPU (see the module docstring)."""
    problems = check_gpu_counts(layout) + check_divisibility(model, layout)
    resident, training = policy_memory(model, layout)
    engine, kv_tokens, engine_problems = engine_memory(model, layout)
    if layout.placement == "colocated":
        columns = [
            MemoryColumn("training phase", {**resident, **training}),
            MemoryColumn("generation phase", {**resident, **engine}),
        ]
    else:
        columns = [MemoryColumn("policy GPU", {**resident, **training}), MemoryColumn("engine GPU", engine)]
    problems += engine_problems + check_memory(columns, layout.gpu_memory_gb)
    return PlanReport(model, layout, columns, kv_tokens, problems)


def render(report: PlanReport) -> str:
    """The plan as text: layout lines, then a per-GPU memory table with one column per kind."""
    m, lay = report.model, report.layout
    optimizer = "distributed optimizer" if lay.distributed_optimizer else "replicated optimizer"
    lines = [
        f"model    {m.name}: {m.total_params / 1e9:.2f}B parameters, {m.layers} layers, hidden {m.hidden}, "
        f"{m.heads} heads / {m.kv_heads} KV heads",
        f"cluster  {lay.nodes} nodes x {lay.gpus_per_node} GPUs = {lay.gpus} GPUs of {lay.gpu_memory_gb:g} GB, {lay.placement}",
        f"policy   TP={lay.tensor_parallel} PP={lay.pipeline_parallel} DP={lay.data_parallel} = {lay.policy_gpus} GPUs, "
        f"{optimizer}, micro-batch {lay.micro_batch_tokens} tokens",
        f"engines  {lay.engines} x TP={lay.engine_tensor_parallel} = {lay.engine_gpus} GPUs, gpu_memory_utilization "
        f"{lay.gpu_memory_utilization}, KV cache {report.kv_cache_tokens} tokens per engine "
        f"({report.kv_cache_tokens // lay.sequence_tokens} sequences of {lay.sequence_tokens})",
        "",
    ]
    names = list(dict.fromkeys(name for column in report.columns for name in column.terms))
    width = max(len(n) for n in names + ["memory per GPU (GB)"])
    header = "memory per GPU (GB)".ljust(width) + "".join(f"  {c.name:>17}" for c in report.columns)
    lines += [header, "-" * len(header)]
    for name in names:
        cells = "".join(f"  {c.terms[name]:>17.1f}" if name in c.terms else f"  {'-':>17}" for c in report.columns)
        lines.append(name.ljust(width) + cells)
    lines.append("-" * len(header))
    lines.append("total".ljust(width) + "".join(f"  {c.total:>17.1f}" for c in report.columns))
    lines.append(f"{'GPU memory':<{width}}" + "".join(f"  {lay.gpu_memory_gb:>17.1f}" for _ in report.columns))
    lines.append("")
    lines.append("fits" if report.fits else "REFUSED")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="megatron-pc plan",
        description="Check that an experiment's layout fits the cluster and estimate memory per GPU.",
    )
    parser.add_argument("config", help="experiment YAML file, or the name of one in configs/")
    parser.add_argument("--nodes", type=int, default=1, help="SLURM nodes (default 1)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--gpu-memory-gb", type=float, default=None, help="GB per GPU (default: cluster.gpu_memory_gb, 141 = H200)")
    parser.add_argument("--no-distributed-optimizer", action="store_true", help="plan optimizer states replicated on every DP rank")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.tensor_parallel=4")
    return parser


def _config_path(name: str) -> str:
    """A file path as given, else configs/<name>.yaml when that exists."""
    named = CONFIGS_DIR / f"{name}.yaml"
    return str(named) if not Path(name).exists() and named.is_file() else name


def layout_from_args(args: argparse.Namespace) -> tuple[ModelShape, Layout]:
    """Read the experiment config named on the command line into a model shape and a layout."""
    from megatron_pc.config import load_config

    cfg = load_config(_config_path(args.config), args.overrides)
    layout = Layout(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_memory_gb=args.gpu_memory_gb if args.gpu_memory_gb is not None else cfg.cluster.gpu_memory_gb,
        placement=cfg.cluster.placement,
        tensor_parallel=cfg.model.tensor_parallel,
        pipeline_parallel=cfg.model.pipeline_parallel,
        data_parallel=cfg.cluster.data_parallel,
        engines=cfg.rollout.engines,
        engine_tensor_parallel=cfg.rollout.tensor_parallel,
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        micro_batch_tokens=cfg.training.micro_batch_tokens,
        sequence_tokens=cfg.rollout.max_model_len,
        params_bytes=4 if cfg.model.params_dtype == "float32" else 2,
        distributed_optimizer=not args.no_distributed_optimizer,
    )
    return load_model_shape(cfg.model.path), layout


def main(argv: list[str] | None = None) -> int:
    """``megatron-pc plan CONFIG --nodes N --gpus-per-node 8 [overrides...]``: print the plan;
    exit 2 with the reasons on stderr when the layout is refused."""
    parser = _parser()
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    for flag in ("nodes", "gpus_per_node"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.gpu_memory_gb is not None and args.gpu_memory_gb <= 0:
        parser.error("--gpu-memory-gb must be > 0")
    model, layout = layout_from_args(args)
    report = plan_layout(model, layout)
    print(render(report))
    for problem in report.problems:
        print(f"megatron-pc plan: refused: {problem}", file=sys.stderr)
    return 0 if report.fits else 2
