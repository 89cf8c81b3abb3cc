"""``megatron-pc plan``: check that a layout fits the cluster before a job is submitted.

:func:`plan_layout` is pure: from a model shape and a :class:`Layout` it checks that the policy
(Megatron TP x PP x DP) and the vLLM engines (engines x engine TP) fit the GPUs and divide the
model, and reckons the memory of each phase of a step per GPU, and the host memory per node
(megatron_pc/launch/memory_model.py: every term with its formula or assumption). A phase over
90% of the memory torch reports for the device is refused. :func:`main` reads the project
config and prints the plan.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from megatron_pc.launch import memory_model as mm
from megatron_pc.launch.ledger import Booking, Ledger, replay, run_events
from megatron_pc.models.shapes import ModelShape, load_model_shape


DEFAULT_HOST_MEMORY_GIB = 2048.0
"""Host memory of one node: a DGX H200 has 2 TB."""


@dataclass(frozen=True)
class Layout:
    """How one experiment is spread over the cluster: everything :func:`plan_layout` checks."""

    nodes: int
    """SLURM nodes."""
    gpus_per_node: int
    """GPUs on each node."""
    device: mm.Device
    """The GPU, with the total memory torch reports for it."""
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
    """vLLM's fraction of the whole device."""
    micro_batch_tokens: int
    """Token budget of one training micro-batch."""
    sequence_tokens: int
    """Longest sequence an engine holds: prompt + response tokens (rollout.max_model_len)."""
    params_bytes: int = 2
    """Bytes per policy parameter (2 bf16, 4 fp32)."""
    distributed_optimizer: bool = True
    """Optimizer states sharded over DP (Megatron's distributed optimizer, on when DP > 1)."""
    logprob_chunk_tokens: int | None = 1024
    """training.logprob_chunk_tokens."""
    sequence_parallel: bool | None = None
    """training.sequence_parallel; None: on when TP > 1 (the GPU default)."""
    offload_grads: bool | None = None
    """training.offload_grads; None: on when colocated."""
    offload_optimizer: bool | None = None
    """training.offload_optimizer; None: on when colocated."""
    empty_cache: bool | None = None
    """training.empty_cache; None: on when colocated."""
    sync_bucket_mb: int = 64
    """rollout.sync_bucket_mb."""
    reference_model: bool = False
    """A reference model runs (training.kl_coef > 0)."""
    host_memory_gib: float = DEFAULT_HOST_MEMORY_GIB
    """Host memory of one node."""
    layer_spec: str = "auto"
    """model.layer_spec (megatron_pc/models/layer_specs.py)."""
    transformer_engine: bool = True
    """Transformer Engine is installed where the job runs (``plan --te/--no-te``; detected by default)."""

    def resolved_layer_spec(self) -> str:
        """The spec the GPU job builds (raises LayerSpecError for one it cannot build)."""
        from megatron_pc.models.layer_specs import resolve_layer_spec

        sp = self.sequence_parallel if self.sequence_parallel is not None else self.tensor_parallel > 1
        return resolve_layer_spec(self.layer_spec, sp and self.tensor_parallel > 1, True, self.transformer_engine)

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

    @property
    def colocated(self) -> bool:
        """Policy and engines share every GPU."""
        return self.placement == "colocated"

    def memory_inputs(self) -> mm.MemoryInputs:
        """The memory model's inputs, every None setting resolved for this placement on GPUs."""
        def default(value: bool | None, fallback: bool) -> bool:
            return fallback if value is None else value

        return mm.MemoryInputs(
            tensor_parallel=self.tensor_parallel, pipeline_parallel=self.pipeline_parallel,
            data_parallel=self.data_parallel, engine_tensor_parallel=self.engine_tensor_parallel,
            gpu_memory_utilization=self.gpu_memory_utilization, micro_batch_tokens=self.micro_batch_tokens,
            sequence_tokens=self.sequence_tokens, colocated=self.colocated, params_bytes=self.params_bytes,
            distributed_optimizer=self.distributed_optimizer, logprob_chunk_tokens=self.logprob_chunk_tokens,
            sequence_parallel=default(self.sequence_parallel, self.tensor_parallel > 1),
            offload_grads=default(self.offload_grads, self.colocated),
            offload_optimizer=default(self.offload_optimizer, self.colocated),
            empty_cache=default(self.empty_cache, self.colocated),
            sync_bucket_mb=self.sync_bucket_mb, reference_model=self.reference_model,
            layer_spec=self._spec_or_local(),
        )

    def _spec_or_local(self) -> str:
        """The resolved spec; one that cannot be built is planned as asked (the refusal itself is
        :func:`check_layer_spec`'s)."""
        from megatron_pc.models.layer_specs import LayerSpecError

        try:
            return self.resolved_layer_spec()
        except LayerSpecError:
            return self.layer_spec


@dataclass
class PlanReport:
    """Result of :func:`plan_layout`: the layout, memory per phase, and why it is refused if it is."""

    model: ModelShape
    """The model planned for."""
    layout: Layout
    """The layout checked."""
    phases: list[mm.Phase]
    """Memory per GPU in each phase of a step (colocated: one GPU; split: each pool's)."""
    host: mm.Phase
    """Host memory of one node."""
    kv_cache_tokens: int
    """Tokens the KV cache of one engine holds (0 when the weights do not fit)."""
    problems: list[str]
    """Each reason the layout cannot run; empty when it fits."""
    peak_event: Booking | None = None
    """The event of a run (megatron_pc/launch/ledger.py, fresh and resumed) that takes the
    largest share of a device or of the host."""

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
    if layout.colocated:
        problems = []
        if layout.policy_gpus != layout.gpus:
            problems.append(f"colocated: {policy}, but {have} (set cluster.data_parallel)")
        if layout.engine_gpus != layout.gpus:
            problems.append(f"colocated: {engines}, but {have} (set rollout.engines)")
        return problems
    if layout.policy_gpus + layout.engine_gpus > layout.gpus:
        return [f"split: {policy} + {engines} = {layout.policy_gpus + layout.engine_gpus} GPUs, but {have}"]
    return []


def check_engines(model: ModelShape, layout: Layout) -> tuple[int, list[str]]:
    """KV-cache tokens of one engine, and the problems of its budget."""
    m = layout.memory_inputs()
    total = layout.device.total_gib
    weights, _, tokens = mm.kv_cache_tokens(model, m, total)
    budget = m.gpu_memory_utilization * total
    if weights + mm.ENGINE_RESERVE_GIB >= budget:
        return 0, [
            f"vLLM weights ({weights:.1f} GiB per GPU at engine TP={m.engine_tensor_parallel}) + {mm.ENGINE_RESERVE_GIB:g} GiB "
            f"of activations and graphs do not fit in rollout.gpu_memory_utilization={m.gpu_memory_utilization} x "
            f"{total:.1f} GiB = {budget:.1f} GiB"
        ]
    if tokens < layout.sequence_tokens:
        return tokens, [
            f"vLLM KV cache holds {tokens} tokens per engine, fewer than one sequence of "
            f"rollout.max_model_len={layout.sequence_tokens} tokens (vLLM refuses to start)"
        ]
    return tokens, []


def check_layer_spec(layout: Layout) -> list[str]:
    """The layer spec must be one the GPU job can build (TE where asked, no SP with Megatron's local spec)."""
    from megatron_pc.models.layer_specs import LayerSpecError

    try:
        layout.resolved_layer_spec()
    except LayerSpecError as err:
        return [str(err)]
    return []


def check_phases(phases: list[mm.Phase], limit_gib: float, what: str) -> list[str]:
    """A phase over ``limit_gib`` is refused, naming its largest term (and, where the unfused
    attention's scores are a term, what keeps none)."""
    from megatron_pc.models.layer_specs import TE_HOW_TO_GET

    problems = []
    for phase in phases:
        if phase.total > limit_gib:
            term = max(phase.terms, key=lambda t: t.gib)
            scores = next((t for t in phase.terms if t.name.startswith("attention scores")), None)
            hint = (f"; of it, the unfused attention's score matrix {scores.gib:.1f} GiB (Megatron's local spec): use "
                    f"model.layer_spec=sdpa, or Transformer Engine; {TE_HOW_TO_GET}") if scores else ""
            problems.append(
                f"{phase.name}: {phase.total:.1f} GiB does not fit in {mm.LIMIT:.0%} of {what} = {limit_gib:.1f} GiB; "
                f"largest term: {term.name} = {term.gib:.1f} GiB{hint}"
            )
    return problems


def _per_node(layout: Layout) -> tuple[int, int]:
    """(policy GPUs, engine GPUs) on the busiest node."""
    if layout.colocated:
        return layout.gpus_per_node, layout.gpus_per_node
    policy = min(layout.policy_gpus, layout.gpus_per_node)
    return policy, layout.gpus_per_node - policy


def new_ledger(model: ModelShape, layout: Layout) -> Ledger:
    """An empty memory ledger of ``layout`` (nothing started yet)."""
    return Ledger(model, layout.memory_inputs(), layout.device.total_gib, layout.host_memory_gib, *_per_node(layout))


def ledger_problems(model: ModelShape, layout: Layout) -> tuple[Booking, list[str]]:
    """Replay the driver's order (a fresh run and a resumed one, colocated engines asleep
    during the update) in a ledger: the peak event and every event over the limit."""
    reference = layout.memory_inputs().reference_model
    runs = [replay(new_ledger(model, layout), run_events(reference, resume)) for resume in (False, True)]
    peaks = [r.peak() for r in runs]
    peak = max(peaks, key=lambda b: b.share(layout.device.total_gib, layout.host_memory_gib))
    return peak, [p for r in runs for p in r.over()]


def plan_layout(model: ModelShape, layout: Layout) -> PlanReport:
    """Check ``layout`` for ``model`` and reckon its memory (megatron_pc/launch/memory_model.py)."""
    problems = check_gpu_counts(layout) + check_divisibility(model, layout) + check_layer_spec(layout)
    m = layout.memory_inputs()
    total = layout.device.total_gib
    phases = (mm.colocated_phases if layout.colocated else mm.split_phases)(model, m, total)
    host = mm.host_phase(model, m, layout.gpus_per_node, *_per_node(layout))
    kv_tokens, engine_problems = check_engines(model, layout)
    problems += engine_problems + check_phases(phases, mm.LIMIT * total, f"{layout.device.name}'s {total:.1f} GiB")
    problems += check_phases([host], mm.LIMIT * layout.host_memory_gib, f"the node's {layout.host_memory_gib:g} GiB")
    peak, over = ledger_problems(model, layout)
    problems += sorted(set(over))
    return PlanReport(model, layout, phases, host, kv_tokens, problems, peak)


def _settings_lines(m: mm.MemoryInputs) -> list[str]:
    on = {True: "on", False: "off"}
    chunk = m.logprob_chunk_tokens or "whole micro-batch"
    return [
        f"settings sequence_parallel {on[m.sequence_parallel]}, logprob_chunk_tokens {chunk}, offload_grads "
        f"{on[m.offload_grads and m.colocated]}, offload_optimizer {on[m.offload_optimizer and m.colocated]}, empty_cache "
        f"{on[m.empty_cache and m.colocated]}, sync_bucket_mb {m.sync_bucket_mb}",
    ]


SPEC_WORDS = {"te": "Transformer Engine (flash attention, fused norms)",
              "sdpa": "ours (RMSNorm with sequence parallelism, torch SDPA: no score matrix)",
              "local": "Megatron's local spec (unfused attention: keeps the score matrix)"}


def _spec_line(lay: Layout, inputs: mm.MemoryInputs) -> str:
    te = "installed" if lay.transformer_engine else "not installed"
    return f"layers   model.layer_spec {lay.layer_spec} -> {inputs.layer_spec}: {SPEC_WORDS[inputs.layer_spec]}; Transformer Engine {te} (--te/--no-te)"


def _phase_lines(phase: mm.Phase, capacity_gib: float) -> list[str]:
    width = max(len(t.name) for t in phase.terms)
    lines = [f"{phase.name}: {phase.total:.1f} GiB = {phase.total / capacity_gib:.0%} of {capacity_gib:.1f} GiB"]
    lines += [f"  {t.name:<{width}} {t.gib:7.2f}   {t.how}" for t in phase.terms]
    return lines


def _peak_lines(report: PlanReport) -> list[str]:
    """The ledger's peak event: each GPU kind and the host at that moment."""
    peak, lay = report.peak_event, report.layout
    if peak is None:
        return []
    parts = [f"{g.name} {g.total:.1f} GiB = {g.total / lay.device.total_gib:.0%}" for g in peak.gpus]
    parts.append(f"host {peak.host.total:.1f} GiB = {peak.host.total / lay.host_memory_gib:.0%}")
    return [f"peak event of a run in call order (megatron_pc/launch/ledger.py, fresh and resumed): {peak.event}: {', '.join(parts)}"]


def render(report: PlanReport) -> str:
    """The plan as text: layout lines, then each phase with its terms, then host memory."""
    m, lay = report.model, report.layout
    inputs = lay.memory_inputs()
    optimizer = "distributed optimizer" if lay.distributed_optimizer else "replicated optimizer"
    device = lay.device
    lines = [
        f"model    {m.name}: {m.total_params / 1e9:.2f}B parameters, {m.layers} layers, hidden {m.hidden}, "
        f"{m.heads} heads / {m.kv_heads} KV heads",
        f"cluster  {lay.nodes} nodes x {lay.gpus_per_node} GPUs = {lay.gpus} GPUs, {lay.placement}",
        f"device   {device.name}: {device.total_gib:.1f} GiB as torch reports it ({device.source}); limit {mm.LIMIT:.0%} a phase",
        f"policy   TP={lay.tensor_parallel} PP={lay.pipeline_parallel} DP={lay.data_parallel} = {lay.policy_gpus} GPUs, "
        f"{optimizer}, micro-batch {lay.micro_batch_tokens} tokens",
        f"engines  {lay.engines} x TP={lay.engine_tensor_parallel} = {lay.engine_gpus} GPUs, gpu_memory_utilization "
        f"{lay.gpu_memory_utilization} of the whole device, KV cache {report.kv_cache_tokens} tokens per engine "
        f"({report.kv_cache_tokens // lay.sequence_tokens} sequences of {lay.sequence_tokens})",
        _spec_line(lay, inputs),
        *_settings_lines(inputs),
        "",
        "peak memory per GPU in each phase (GiB):",
    ]
    for phase in report.phases:
        lines += _phase_lines(phase, device.total_gib)
    lines += ["", *_phase_lines(report.host, lay.host_memory_gib), "", *_peak_lines(report), "",
              f"assumed: {mm.POLICY_RUNTIME_GIB:g} GiB runtime per policy process, {mm.SLEEPING_ENGINE_GIB:g} GiB per sleeping "
              f"vLLM worker, {mm.ENGINE_RESERVE_GIB:g} GiB of vLLM activations and graphs in its budget, "
              f"{mm.HOST_PROCESS_GIB:g} GiB host RSS per process; activations measured (benchmarks/activations.py); "
              "not counted: activation gradients in flight, allocator fragmentation (the 10% left)", ""]
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
    parser.add_argument("--gpu-memory-gb", type=float, default=None,
                        help="the device by its nominal GB (default: cluster.gpu_memory_gb; 141 = H200, 80 = H100); "
                             "a figure not in the table is taken as exact 10^9 bytes")
    parser.add_argument("--device", choices=list(mm.DEVICES), default=None, help="the device by name (overrides --gpu-memory-gb)")
    parser.add_argument("--host-memory-gib", type=float, default=DEFAULT_HOST_MEMORY_GIB,
                        help=f"host memory of one node (default {DEFAULT_HOST_MEMORY_GIB:g}: a DGX H200)")
    parser.add_argument("--no-distributed-optimizer", action="store_true", help="plan optimizer states replicated on every DP rank")
    parser.add_argument("--te", action=argparse.BooleanOptionalAction, default=None,
                        help="plan with (--te) or without (--no-te) Transformer Engine where the job runs "
                             "(default: whether transformer_engine.pytorch imports here)")
    parser.add_argument("--no-data-check", action="store_true", help="do not check that the config's data files exist")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.tensor_parallel=4")
    return parser


def _model_max_len(model_path: str) -> int:
    """The engines' sequence limit when rollout.max_model_len is unset: the model's own
    max_position_embeddings (as the vLLM engine takes it), 4096 for a known model without a
    directory."""
    config = Path(model_path) / "config.json"
    if config.is_file():
        return int(json.loads(config.read_text()).get("max_position_embeddings", 4096))
    return 4096


def layout_from_args(args: argparse.Namespace) -> tuple[ModelShape, Layout]:
    """Read the experiment config named on the command line into a model shape and a layout."""
    from megatron_pc.config import load_config

    cfg = load_config(args.config, args.overrides)
    gb = args.gpu_memory_gb if args.gpu_memory_gb is not None else cfg.cluster.gpu_memory_gb
    t = cfg.training
    layout = Layout(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        device=mm.device_for(gb, args.device),
        placement=cfg.cluster.placement,
        tensor_parallel=cfg.model.tensor_parallel,
        pipeline_parallel=cfg.model.pipeline_parallel,
        data_parallel=cfg.cluster.data_parallel,
        engines=cfg.rollout.engines,
        engine_tensor_parallel=cfg.rollout.tensor_parallel,
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        micro_batch_tokens=cfg.training.micro_batch_tokens,
        sequence_tokens=cfg.rollout.max_model_len or _model_max_len(cfg.model.path),
        params_bytes=4 if cfg.model.params_dtype == "float32" else 2,
        distributed_optimizer=cfg.cluster.data_parallel > 1 and not args.no_distributed_optimizer,
        logprob_chunk_tokens=t.logprob_chunk_tokens,
        sequence_parallel=t.sequence_parallel,
        offload_grads=t.offload_grads,
        offload_optimizer=t.offload_optimizer,
        empty_cache=t.empty_cache,
        sync_bucket_mb=cfg.rollout.sync_bucket_mb,
        reference_model=t.kl_coef > 0,
        host_memory_gib=args.host_memory_gib,
        layer_spec=cfg.model.layer_spec,
        transformer_engine=_te_where_the_job_runs(args.te),
    )
    return load_model_shape(cfg.model.path), layout


def _te_where_the_job_runs(flag: bool | None) -> bool:
    """``--te``/``--no-te``, else whether Transformer Engine imports in this environment (the
    SLURM bootstrap plans in the job's own environment)."""
    if flag is not None:
        return flag
    from megatron_pc.models.layer_specs import transformer_engine_importable

    return transformer_engine_importable()


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
    if args.host_memory_gib <= 0:
        parser.error("--host-memory-gib must be > 0")
    if not args.no_data_check:
        from megatron_pc.config import load_config
        from megatron_pc.data.config import check_files

        check_files(load_config(args.config, args.overrides).data)  # a job that would fail on its data is refused here
    model, layout = layout_from_args(args)
    report = plan_layout(model, layout)
    print(render(report))
    for problem in report.problems:
        print(f"megatron-pc plan: refused: {problem}", file=sys.stderr)
    return 0 if report.fits else 2
