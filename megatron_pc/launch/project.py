"""``megatron-pc project [CONFIG]``: seconds per step of Pilot-Commit, GRPO and DAPO for a
config's batch shapes on its cluster (default: Qwen3-14B on 8 x 8 H200, the paper's 64 GPUs).

It is an analytic model. Every input is printed with where it comes from:
* **Rollouts per step of each strategy.** They follow from the config's batch shapes and the
  data's zero-variance share z and Pilot-Commit keep rate k, measured for the start model:
  - GRPO: train_batch x n.
  - DAPO: rounds of dapo_batch x n until train_batch informative groups survive, an expected
    train_batch / (1 - z) prompts and at least one round.
  - Pilot-Commit: train_batch x commit_n commits, plus rounds of pilot.batch x pilot.n until
    train_batch survive (an expected train_batch / k piloted prompts, at least one round).

  By default z and k are the `paper_like` regime's values measured on the tiny model by
  `megatron-pc bench rollouts` (its calibration); `--from-summary` reads them from a
  benchmark's summary.json.
* **Generation on each engine** (vLLM, tensor parallel TP). Every engine gets an equal share r
  of the step's rollouts; decoding runs them concurrently, up to rollout.max_num_seqs at once.
  - A decode iteration reads the engine's weights once, plus the KV cache of every running
    sequence, from HBM. So a wave of sequences lasts its longest response times the weight
    read, plus the KV read summed over every sequence's decoded tokens.
  - The longest response of a wave is rollout.max_tokens when any response is truncated
    (``--truncated-share`` > 0), else the mean response length x ``--tail``.
  - Prefill is compute-bound: its FLOPs at ``--prefill-mfu``.
* **Training** (old log-probs, the update: 4 forward passes' FLOPs over every trained token)
  runs on the policy's GPUs at ``--train-mfu`` (a GPU run of `megatron-pc bench step --json`
  measures it: ``--from-bench-step``).
* **Weight sync**: the bf16 weights at ``--sync-gbps`` in the step; below the table, the refit
  projected per transport from its stages' bytes and stated link bandwidths
  (:mod:`megatron_pc.launch.refit`). **Fixed overhead per step** (engine
  sleep / wake, reward grading, the controller): ``--overhead-s``.

A step's rounds run one after another, each one engine call (two for Pilot-Commit with
``allocation.binding=false``) that lasts its longest response. Colocated placement adds
generation and training; pipelined split placement takes their maximum.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from megatron_pc.errors import MegatronPCError
from megatron_pc.launch.refit import Links, format_refit, refit
from megatron_pc.models.shapes import ModelShape
from megatron_pc.metrics.mfu import PEAK_TFLOPS, forward_flops

PAPER_STEP_RATIOS = {"grpo": 1.21, "dapo": 1.83}
"""The paper's wall-clock per step on 64 H200: PC is 1.21x faster than GRPO, 1.83x than DAPO."""
HBM_TBPS = {"H200": 4.8, "H100": 3.35, "A100": 2.0}
"""HBM bandwidth in TB/s (data sheets, SXM)."""
MEASURED_PAPER_LIKE = {"z": 0.568, "keep_rate": 0.310}
"""z and the predicted pilot keep rate of the `paper_like` regime, measured on the warm-up tiny
model (500 validation prompts x 16 samples; `megatron-pc bench rollouts`, 2026-12-02)."""


@dataclass
class Assumptions:
    """Every number the projection rests on that the config does not give."""

    gpu: str = "H200"
    nodes: int = 8
    gpus_per_node: int = 8
    z: float = MEASURED_PAPER_LIKE["z"]
    keep_rate: float = MEASURED_PAPER_LIKE["keep_rate"]
    data_source: str = "paper_like regime, measured on the tiny model (bench rollouts calibration)"
    prompt_tokens: float = 200.0
    """Mean prompt length (chat template included)."""
    response_tokens: float = 2000.0
    """Mean response length."""
    truncated_share: float = 0.05
    """Share of responses cut at max_tokens (any > 0: a wave lasts max_tokens iterations)."""
    tail: float = 2.0
    """Without truncation, the longest response of a wave over the mean one."""
    hbm_efficiency: float = 0.7
    """Share of the HBM bandwidth a decode iteration reaches."""
    prefill_mfu: float = 0.4
    train_mfu: float = 0.35
    train_mfu_source: str = "assumed (a typical Megatron-Core figure for a dense 14B model)"
    sync_gbps: float = 50.0
    overhead_s: float = 10.0


def rollouts_per_step(cfg: Any, a: Assumptions) -> dict[str, dict[str, float]]:
    """Generated and trained rollouts per step, and generation rounds, of each strategy."""
    al = cfg.allocation
    tb, n = al.train_batch, al.n
    dapo_prompts = max(al.rollouts_per_dapo_round, tb / max(1.0 - a.z, 1e-9))
    pilots = max(al.pilot.batch, tb / max(a.keep_rate, 1e-9))
    return {
        "pilot_commit": {"generated": pilots * al.pilot.n + tb * al.commit_rollouts, "trained": tb * n, "requests": pilots + tb,
                         "rounds": max(1.0, tb / (al.pilot.batch * a.keep_rate))},
        "grpo": {"generated": tb * n, "trained": tb * n, "requests": tb, "rounds": 1.0},
        "dapo": {"generated": dapo_prompts * n, "trained": tb * n, "requests": dapo_prompts,
                 "rounds": max(1.0, dapo_prompts / al.rollouts_per_dapo_round)},
    }  # fmt: skip


def generation_seconds(shape: ModelShape, cfg: Any, a: Assumptions, rollouts: float, requests: float, calls: float) -> dict[str, float]:
    """Seconds of one step's generation: prefill and decode on each engine (all engines at once),
    over ``calls`` engine calls (rounds, times two for Pilot-Commit without binding) that each
    last their longest response."""
    ro = cfg.rollout
    engines, tp = ro.engines, ro.tensor_parallel
    bw = HBM_TBPS[a.gpu] * 1e12 * a.hbm_efficiency * tp  # one engine's GPUs together
    peak = PEAK_TFLOPS[a.gpu] * 1e12 * tp
    weight_bytes = 2.0 * shape.total_params  # bf16
    kv_bytes = shape.layers * 2 * shape.kv_heads * shape.head_dim * 2  # per token of context, bf16
    r = rollouts / engines
    waves = calls * math.ceil(r / calls / ro.max_num_seqs)  # a call's sequences, max_num_seqs at a time
    longest = ro.max_tokens if a.truncated_share > 0 else min(ro.max_tokens, a.tail * a.response_tokens)
    m, p = a.response_tokens, a.prompt_tokens
    decode = waves * longest * weight_bytes / bw + r * (m * p + m * m / 2) * kv_bytes / bw
    prefill_tokens = requests / engines * p
    prefill = forward_flops(shape, prefill_tokens, requests / engines * p * p / 2) / (a.prefill_mfu * peak)
    return {"decode": decode, "prefill": prefill, "total": decode + prefill, "waves": waves, "longest_response": longest}


def training_seconds(shape: ModelShape, cfg: Any, a: Assumptions, trained: float) -> float:
    """Old log-probs (one forward pass) and the update (three) over every trained token."""
    world = cfg.policy_world
    colocated = cfg.cluster.colocated
    gpus = a.nodes * a.gpus_per_node if colocated else world
    t = a.prompt_tokens + a.response_tokens
    flops = 4.0 * forward_flops(shape, trained * t, trained * t * t / 2)
    return flops / (a.train_mfu * PEAK_TFLOPS[a.gpu] * 1e12 * gpus)


def project(cfg: Any, shape: ModelShape, a: Assumptions) -> dict[str, Any]:
    """Seconds per step and their parts for every strategy, and the ratios to Pilot-Commit."""
    gpus = a.nodes * a.gpus_per_node
    world = cfg.policy_world
    engine_gpus = cfg.rollout.engines * cfg.rollout.tensor_parallel
    need = max(world, engine_gpus) if cfg.cluster.colocated else world + engine_gpus
    if need > gpus:
        raise MegatronPCError(f"the layout needs {need} GPUs (policy TP x PP x DP = {world}, engines x TP = {engine_gpus}, "
                              f"{cfg.cluster.placement} placement) but --nodes x --gpus-per-node gives {gpus}")  # fmt: skip
    counts = rollouts_per_step(cfg, a)
    sync = 2.0 * shape.total_params / (a.sync_gbps * 1e9)
    out: dict[str, Any] = {}
    for name, c in counts.items():
        calls = c["rounds"] * (2 if name == "pilot_commit" and not cfg.allocation.binding else 1)
        gen = generation_seconds(shape, cfg, a, c["generated"], c["requests"], calls)
        train = training_seconds(shape, cfg, a, c["trained"])
        pipelined = cfg.training.pipelined
        step = (max(gen["total"], train) if pipelined else gen["total"] + train) + sync + a.overhead_s
        out[name] = {**c, "generation_s": gen["total"], "decode_s": gen["decode"], "prefill_s": gen["prefill"], "waves": gen["waves"],
                     "training_s": train, "sync_s": sync, "overhead_s": a.overhead_s, "step_s": step}  # fmt: skip
    pc = out["pilot_commit"]["step_s"]
    ratios = {name: out[name]["step_s"] / pc for name in ("grpo", "dapo")}
    return {"strategies": out, "step_ratio_vs_pilot_commit": ratios, "paper": PAPER_STEP_RATIOS, "assumptions": asdict(a),
            "model": shape.name, "gpus": a.nodes * a.gpus_per_node,
            "refit": refit(shape, cfg, Links.for_gpu(a.gpu, HBM_TBPS[a.gpu]), a.nodes)}  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="megatron-pc project", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("config", nargs="?", default="configs/qwen3_14b.yaml", help="experiment YAML (default: Qwen3-14B)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. training.pipelined=true cluster.placement=split")
    parser.add_argument("--from-summary", metavar="SUMMARY", help="a bench rollouts summary.json: z and keep rate of --regime from it")
    parser.add_argument("--regime", default="paper_like", help="the regime whose calibration --from-summary reads")
    parser.add_argument("--from-bench-step", metavar="JSON", help="`bench step --json` output of a GPU run: its update MFU")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    for field, value in asdict(Assumptions()).items():
        if field in ("data_source", "train_mfu_source"):
            continue
        kind = type(value) if not isinstance(value, bool) else str
        parser.add_argument(f"--{field.replace('_', '-')}", type=kind, default=None, help=f"default {value}")
    return parser


def _assumptions(args: argparse.Namespace) -> Assumptions:
    a = Assumptions()
    for field in asdict(a):
        value = getattr(args, field, None)
        if value is not None:
            setattr(a, field, value)
    if a.gpu not in PEAK_TFLOPS or a.gpu not in HBM_TBPS:
        raise MegatronPCError(f"--gpu: unknown {a.gpu!r}; choose from {', '.join(HBM_TBPS)}")
    for name in ("z", "truncated_share"):
        if not 0.0 <= getattr(a, name) < 1.0:
            raise MegatronPCError(f"--{name.replace('_', '-')}: must lie in [0, 1), got {getattr(a, name)}")
    for name in ("keep_rate", "hbm_efficiency", "prefill_mfu", "train_mfu"):
        if not 0.0 < getattr(a, name) <= 1.0:
            raise MegatronPCError(f"--{name.replace('_', '-')}: must lie in (0, 1], got {getattr(a, name)}")
    for name in ("nodes", "gpus_per_node", "prompt_tokens", "response_tokens", "tail", "sync_gbps"):
        if getattr(a, name) <= 0:
            raise MegatronPCError(f"--{name.replace('_', '-')}: must be > 0, got {getattr(a, name)}")
    if args.from_summary:
        a.z, a.keep_rate = _calibration(Path(args.from_summary), args.regime)
        a.data_source = f"{args.regime} regime calibration in {args.from_summary}"
    if args.from_bench_step:
        a.train_mfu, a.train_mfu_source = _measured_train_mfu(Path(args.from_bench_step))
    return a


def _calibration(path: Path, regime: str) -> tuple[float, float]:
    try:
        summary = json.loads(path.read_text())
        cal = summary["calibration"][regime]
        return float(cal["z"]), float(cal["keep_rate"])
    except (OSError, ValueError) as err:
        raise MegatronPCError(f"--from-summary: cannot read {path}: {err}") from None
    except (KeyError, TypeError):
        raise MegatronPCError(f"--from-summary: {path} holds no calibration of regime {regime!r} (calibration.{regime}.z / .keep_rate)") from None


def _measured_train_mfu(path: Path) -> tuple[float, str]:
    try:
        result = json.loads(path.read_text())
        mfu = result["mfu"]["pilot_commit"]["update"]
        device = result["peak"]["device"]
    except (OSError, ValueError) as err:
        raise MegatronPCError(f"--from-bench-step: cannot read {path}: {err}") from None
    except (KeyError, TypeError):
        raise MegatronPCError(f"--from-bench-step: {path} holds no mfu.pilot_commit.update (the output of `bench step --json`)") from None
    if result["peak"].get("unit") != "gpu":
        raise MegatronPCError(f"--from-bench-step: {path} was measured on {device}, not a GPU: its MFU says nothing about an H200")
    return float(mfu), f"measured by bench step on {device} ({path})"


def format_projection(result: dict[str, Any], config: str) -> str:
    """The projection as text: a table per strategy, the ratios beside the paper's, the assumptions."""
    a = result["assumptions"]
    lines = [f"projection: {config} ({result['model']}) on {a['nodes']} x {a['gpus_per_node']} {a['gpu']}", "",
             "| strategy | rollouts/step | rounds | generation s (decode + prefill) | training s | sync s | overhead s | s/step |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, s in result["strategies"].items():
        lines.append(f"| {name} | {s['generated']:,.0f} | {s['rounds']:.2f} | {s['generation_s']:.1f} ({s['decode_s']:.1f} + {s['prefill_s']:.1f}) | "
                     f"{s['training_s']:.1f} | {s['sync_s']:.1f} | {s['overhead_s']:.0f} | {s['step_s']:.1f} |")  # fmt: skip
    lines.append("")
    for name, ratio in result["step_ratio_vs_pilot_commit"].items():
        lines.append(f"{name} s/step / pilot_commit s/step: {ratio:.2f}x (paper: {result['paper'][name]:.2f}x)")
    lines += ["", *format_refit(result["refit"])]
    lines += ["", "assumptions:"] + [f"  {k}: {v}" for k, v in a.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the projection."""
    from megatron_pc.config import load_config
    from megatron_pc.config_cli import split_config_args
    from megatron_pc.models.shapes import load_model_shape

    args = _parser().parse_intermixed_args(argv)
    config, overrides = split_config_args(args.config, args.overrides)
    config = config or "configs/qwen3_14b.yaml"
    cfg = load_config(config, overrides)
    a = _assumptions(args)
    result = project(cfg, load_model_shape(str(cfg.model.path)), a)
    print(json.dumps(result, indent=1) if args.json else format_projection(result, config))
    return 0
