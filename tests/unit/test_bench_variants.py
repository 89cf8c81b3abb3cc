"""bench rollouts' update rules and variants: the run directories, the settings each run gets,
the updates a step then takes, and the kept 1-update runs read (and reused) as ``equal/1``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from megatron_pc.allocation import Rollout, TrainGroup
from benchmarks import strategies as bench
from megatron_pc.analysis.runs import load_run, rule_of_config
from benchmarks.variants import CONTROLS, VARIANTS, UpdateRule, parse_rule
from megatron_pc.config import load_config
from megatron_pc.driver.update import plan_rows
from megatron_pc.errors import MegatronPCError
from megatron_pc.training.payload import RolloutPayload

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "tiny_cpu.yaml")
KEPT = REPO / "results" / "bench_rollouts" / "hard"


def _jobs(tmp_path: Path, *flags: str) -> dict[str, bench.Job]:
    """The benchmark's jobs of one regime and seed, by label, as ``bench rollouts FLAGS`` plans them."""
    args = bench._parser().parse_intermixed_args([CONFIG, "--regimes", "hard", "--seeds", "1", "--out", str(tmp_path), *flags])
    regimes, strategies, variants, _ = bench._check_args(args)
    return {j.label: j for j in bench.labelled_jobs(args, regimes[0], tmp_path, strategies, variants)}


def _updates(job: bench.Job) -> int:
    """Optimizer updates of one full step of the job's configuration (every group of n rollouts)."""
    cfg = load_config(CONFIG, list(job.overrides))
    a = cfg.allocation
    groups = [TrainGroup(p, [Rollout(float(k % 2), bool(k % 2), RolloutPayload.of([5, 6], [-1.0, -1.0], "stop", [1, 2])) for k in range(a.n)], step=1)
              for p in range(a.train_batch)]  # fmt: skip
    return len(plan_rows(groups, cfg).denominators)


def test_the_reference_rule_gives_pc_6_updates_a_step_and_grpo_and_dapo_4(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path, "--update-rule", "reference", "--variants", ",".join(CONTROLS))
    assert {label: _updates(job) for label, job in jobs.items()} == {
        "pilot_commit": 6, "grpo": 4, "dapo": 4, "grpo_fair": 4, "dapo_3x": 4,
        "grpo_half": 2,  # the recipe keeps its mini-batch (8 prompts) when the batch halves
        "pc_4up": 4,  # its own rule: 4 equal updates whatever the benchmark's
    }  # fmt: skip
    assert {label: job.run_dir.parent.name for label, job in jobs.items()} == {
        "pilot_commit": "pilot_commit@reference", "grpo": "grpo@reference", "dapo": "dapo@reference",
        "grpo_fair": "grpo_fair@reference", "dapo_3x": "dapo_3x@reference", "grpo_half": "grpo_half@reference", "pc_4up": "pc_4up@equal4",
    }  # fmt: skip
    cfg = {label: load_config(CONFIG, list(job.overrides)) for label, job in jobs.items()}
    assert cfg["grpo_fair"].training.loss_denominator == "informative" and cfg["grpo"].training.loss_denominator == "all"
    assert cfg["dapo_3x"].allocation.rollouts_per_dapo_round == 3 * cfg["dapo"].allocation.train_batch
    assert cfg["grpo_half"].allocation.train_batch * 2 == cfg["grpo"].allocation.train_batch
    assert cfg["pc_4up"].training.mini_batch_unit == "groups" and cfg["pilot_commit"].training.mini_batch_unit == "call_rollouts"


def test_the_equal_rule_gives_every_strategy_the_same_updates_and_1_update_keeps_the_old_layout(tmp_path: Path) -> None:
    four = _jobs(tmp_path, "--update-rule", "equal", "--updates", "4", "--variants", "grpo_half,pc_history")
    assert {label: _updates(job) for label, job in four.items()} == {"pilot_commit": 4, "grpo": 4, "dapo": 4, "grpo_half": 4, "pc_history": 4}
    assert four["grpo"].run_dir.parent.name == "grpo@equal4"
    one = _jobs(tmp_path, "--update-rule", "equal", "--variants", "pc_history")
    assert {label: (_updates(job), job.run_dir.parent.name) for label, job in one.items()} == {
        "pilot_commit": (1, "pilot_commit"), "grpo": (1, "grpo"), "dapo": (1, "dapo"), "pc_history": (1, "pc_history")}  # fmt: skip


def test_rules_and_variants_are_checked_naming_the_option(tmp_path: Path) -> None:
    with pytest.raises(MegatronPCError, match="--updates: only with --update-rule equal"):
        _jobs(tmp_path, "--update-rule", "reference", "--updates", "4")
    with pytest.raises(MegatronPCError, match="--updates: must be >= 1"):
        parse_rule("equal", 0)
    with pytest.raises(MegatronPCError, match="pilot_commit: --updates 3 does not divide its train batch 32"):
        _jobs(tmp_path, "--update-rule", "equal", "--updates", "3", "--variants", "none")
    with pytest.raises(MegatronPCError, match=r"--variant-regimes: \['mixed'\] not among --regimes hard"):
        _jobs(tmp_path, "--variant-regimes", "mixed")
    assert set(CONTROLS) <= set(VARIANTS) and all(VARIANTS[c].summary for c in CONTROLS)


def test_variants_run_only_on_the_variant_regimes(tmp_path: Path) -> None:
    args = bench._parser().parse_intermixed_args([CONFIG, "--regimes", "mixed,hard", "--variant-regimes", "hard", "--variants", "grpo_fair",
                                                  "--seeds", "2", "--out", str(tmp_path)])  # fmt: skip
    regimes, strategies, variants, _ = bench._check_args(args)
    labels = {r.name: sorted({j.label for j in bench.labelled_jobs(args, r, tmp_path, strategies, variants)}) for r in regimes}
    assert labels == {"mixed": ["dapo", "grpo", "pilot_commit"], "hard": ["dapo", "grpo", "grpo_fair", "pilot_commit"]}


def test_rule_labels() -> None:
    assert (UpdateRule("reference").label, UpdateRule("reference").dir_suffix) == ("reference", "@reference")
    assert (UpdateRule("equal", 4).label, UpdateRule("equal", 4).dir_suffix) == ("equal/4", "@equal4")
    assert (UpdateRule("equal", 1).label, UpdateRule("equal", 1).dir_suffix) == ("equal/1", "")
    assert rule_of_config({"training": {"mini_batch_unit": "call_rollouts", "mini_batch": 8}, "allocation": {"train_batch": 32}}) == "reference"
    assert rule_of_config({"training": {"mini_batch": 8}, "allocation": {"train_batch": 32}}) == "equal/4"


def test_the_kept_one_update_runs_read_as_equal_1_and_are_reused_by_an_equal_1_benchmark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = load_run(KEPT / "grpo" / "seed_0", regime="hard", strategy="grpo", seed=0)
    assert run.update_rule == "equal/1" and run.variant == "none"
    assert rule_of_config(yaml.safe_load((KEPT / "pilot_commit" / "seed_0" / "config.yaml").read_text())) == "equal/1"
    # Where scripts/bench_results.sh restore puts them; their configs name the validation set relative to the repository.
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs" / "bench_rollouts"
    for label in ("pilot_commit", "grpo", "dapo"):
        shutil.copytree(KEPT / label / "seed_0", out / "hard" / label / "seed_0")
    old = ["--update-rule", "equal", "--steps", "150", "--validate-every", "5", "--val-size", "1000", "--variants", "none"]
    for label, job in _jobs(out, *old).items():
        bench.check_same_config(CONFIG, job, [*job.overrides, f"seed={job.seed}"])  # raises on any difference
        assert bench.finished_steps(job.run_dir) == 150
    # The same runs are not taken for the reference rule: those go to their own directories.
    assert all(not job.run_dir.exists() for job in _jobs(out, "--update-rule", "reference", "--variants", "none").values())


def test_the_report_shows_each_labels_rule_and_variant(tmp_path: Path) -> None:
    from megatron_pc.analysis.report import summarize
    from megatron_pc.analysis.report_format import markdown

    runs = [load_run(KEPT / label / "seed_0", regime="hard", strategy=name, seed=0, variant=variant)
            for label, name, variant in (("pilot_commit", "pilot_commit", "none"), ("grpo", "grpo", "none"), ("pc_history", "pc_history", "pc_history"))]  # fmt: skip
    summary = summarize(runs)
    regime = summary["regimes"]["hard"]
    assert [(r["strategy"], r["update_rule"], r["variant"]) for r in regime["runs"]] == [
        ("pilot_commit", "equal/1", "none"), ("grpo", "equal/1", "none"), ("pc_history", "equal/1", "pc_history")]  # fmt: skip
    assert {n: (f["update_rule"], f["variant"], f["updates_per_step"]) for n, f in regime["strategies"].items()} == {
        "pilot_commit": ("equal/1", "none", 1.0), "grpo": ("equal/1", "none", 1.0), "pc_history": ("equal/1", "pc_history", 1.0)}  # fmt: skip
    report = markdown(summary, [])
    assert "| target | pilot_commit [equal/1] | grpo [equal/1] | pc_history [equal/1] | grpo/PC | pc_history/PC |" in report
    assert "| grpo | equal/1 | none | 1 |" in report


def test_the_screen_variants_differ_only_in_their_feature_source(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path, "--update-rule", "reference", "--variants", "pc_screen,pc_screen_policy")
    cfg = {label: load_config(CONFIG, list(job.overrides)).allocation.history for label, job in jobs.items()}
    assert (cfg["pc_screen"].preset, cfg["pc_screen"].features) == ("screen", "ngrams")
    assert (cfg["pc_screen_policy"].preset, cfg["pc_screen_policy"].features) == ("screen", "policy")
    assert jobs["pc_screen_policy"].run_dir.parent.name == "pc_screen_policy@reference"
    assert {label: _updates(job) for label, job in jobs.items() if label.startswith("pc_")} == {"pc_screen": 6, "pc_screen_policy": 6}
