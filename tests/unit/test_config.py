"""Configuration: YAML + dotted overrides, and validation errors that name the field."""

from __future__ import annotations

import pytest

from megatron_pc.config import Config, load_config, to_dict
from megatron_pc.errors import ConfigError


def _fails(overrides: list[str], field: str, *words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert info.value.field == field, str(info.value)
    for word in words:
        assert word in str(info.value)


def test_no_config_is_the_tiny_cpu_run() -> None:
    cfg = load_config()
    assert cfg.name == "tiny_cpu" and cfg != Config()  # the defaults are a real GPU run's (test_config_defaults.py)
    assert cfg.allocation.strategy == "pilot_commit"
    assert cfg.allocation.pilot_kept + cfg.allocation.commit_rollouts == cfg.allocation.n


def test_yaml_file_then_dotted_overrides(tmp_path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("name: exp\nallocation:\n  train_batch: 8\n  pilot:\n    batch: 24\n")
    cfg = load_config(path, ["allocation.train_batch=16", "allocation.pilot.keep=first", "training.lr=1e-5"])
    assert cfg.name == "exp"
    assert cfg.allocation.train_batch == 16
    assert cfg.allocation.pilot.batch == 24
    assert cfg.allocation.pilot.keep == "first"
    assert cfg.training.lr == pytest.approx(1e-5)


def test_unknown_key_suggests_close_matches() -> None:
    _fails(["allocation.p_uper=0.5"], "allocation.p_uper", "unknown field", "did you mean allocation.p_upper")


def test_unknown_section_is_named() -> None:
    _fails(["alocation.n=4"], "alocation", "did you mean allocation")


def test_wrong_type_is_named() -> None:
    _fails(["allocation.train_batch=lots"], "allocation.train_batch", "must be an integer", "lots")
    _fails(["allocation.train_batch=2.5"], "allocation.train_batch", "integer")
    _fails(["logging.jsonl=1"], "logging.jsonl", "true or false")


def test_literal_choices_are_listed() -> None:
    _fails(["allocation.strategy=ppo"], "allocation.strategy", "'pilot_commit'", "'grpo'", "'dapo'")


def test_a_choice_yaml_would_read_as_a_boolean_is_the_choice(tmp_path) -> None:
    assert load_config(None, ["allocation.history.preset=off"]).allocation.history.preset == "off"
    path = tmp_path / "run.yaml"
    path.write_text("allocation:\n  history:\n    preset: off\n")
    assert load_config(str(path)).allocation.history.preset == "off"
    _fails(["allocation.history.preset=yes"], "allocation.history.preset", "'off'", "'history_aware'", "got True")


def test_band_order_is_checked() -> None:
    _fails(["allocation.p_lower=0.8", "allocation.p_upper=0.5"], "allocation.p_lower", "<= p_upper")


def test_thresholds_must_lie_in_unit_interval() -> None:
    _fails(["allocation.p_evict=1.5"], "allocation.p_evict", "[0, 1]")
    _fails(["allocation.p_lower=-0.1"], "allocation.p_lower", "[0, 1]")


def test_kept_pilots_cannot_exceed_pilot_rollouts() -> None:
    _fails(["allocation.pilot.n_effective=6"], "allocation.pilot.n_effective", "<= pilot.n (4)")


def test_non_positive_sizes_are_refused() -> None:
    _fails(["allocation.train_batch=0"], "allocation.train_batch", ">= 1")
    _fails(["rollout.max_tokens=0"], "rollout.max_tokens", ">= 1")
    _fails(["allocation.pilot.batch=-3"], "allocation.pilot.batch", ">= 1")


def test_group_size_must_match_across_strategies() -> None:
    _fails(["allocation.commit_n=20"], "allocation.commit_n", "must equal n (16)")


def test_a_train_batch_that_can_never_be_filled_is_refused() -> None:
    _fails(["allocation.pilot.batch=2", "allocation.max_rounds=3"], "allocation.pilot.batch", "can never fill")
    _fails(["allocation.max_rounds=1"], "allocation.max_rounds", ">= 2")
    # 12 commit rollouts over 8 engines: commits come in pairs, so 33 groups never fill.
    _fails(["rollout.engines=8", "allocation.train_batch=33", "allocation.pilot.batch=96"], "allocation.train_batch", "multiple of 2")


def test_each_strategy_checks_only_what_it_needs() -> None:
    # Pilot-Commit's rules (a commit one round after the pilot, pilots that can fill the batch)
    # are Pilot-Commit's: GRPO and DAPO load with the same settings.
    for strategy in ("grpo", "dapo"):
        load_config(None, [f"allocation.strategy={strategy}", "allocation.max_rounds=1", "allocation.pilot.batch=2"])
    _fails(["allocation.strategy=pilot_commit", "allocation.max_rounds=1"], "allocation.max_rounds", "for pilot_commit")
    # The rank rules name each strategy's own field: GRPO's round is the train batch, DAPO's its dapo_batch.
    _fails(["allocation.strategy=grpo", "rollout.engines=3"], "allocation.train_batch", "over 3 generation engines")
    _fails(["allocation.strategy=dapo", "rollout.engines=3", "allocation.dapo_batch=32"], "allocation.dapo_batch", "over 3 generation engines")
    load_config(None, ["allocation.strategy=dapo", "rollout.engines=3", "allocation.dapo_batch=33", "allocation.train_batch=32"])


def test_missing_or_broken_file_is_named(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("allocation: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(scalar)


def test_malformed_override_is_refused() -> None:
    _fails(["allocation.train_batch"], "allocation.train_batch", "section.field=value")


def test_config_round_trips_through_a_plain_dict() -> None:
    from megatron_pc.config import from_dict

    cfg = load_config(None, ["allocation.strategy=dapo", "allocation.dapo_batch=64"])
    assert from_dict(Config, to_dict(cfg)) == cfg


def test_every_config_file_in_configs_loads() -> None:
    from pathlib import Path

    files = sorted(Path(__file__).resolve().parents[2].joinpath("configs").glob("*.yaml"))
    assert files, "configs/ holds the named experiments"
    for path in files:
        load_config(path)


def test_cpu_threads_share_the_cores_between_the_workers_busy_at_once() -> None:
    from megatron_pc.cluster.placement import cpu_threads

    def threads(*overrides: str, cores: int = 8) -> dict[str, int]:
        cfg = load_config(None, list(overrides))
        return cpu_threads(cfg.cluster, cfg.layout, cores)

    # Colocated: a phase's workers have every core (the policy trains while the engines idle).
    assert threads() == {"policy": 8, "engine": 8}
    assert threads("model.tensor_parallel=2", "cluster.data_parallel=2", "rollout.engines=2") == {"policy": 2, "engine": 4}
    assert threads("model.tensor_parallel=3", cores=2) == {"policy": 1, "engine": 2}
    # Split: both pools run at once and share the cores.
    assert threads("cluster.placement=split", "model.tensor_parallel=2", "rollout.engines=2") == {"policy": 2, "engine": 2}
    assert threads("cluster.cpu_threads=3") == {"policy": 3, "engine": 3}
    with pytest.raises(ConfigError, match="cpu_threads"):
        load_config(None, ["cluster.cpu_threads=0"])
