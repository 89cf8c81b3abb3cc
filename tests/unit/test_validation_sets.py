"""Several validation sets: the data.validation forms, their errors, loading, evaluation, metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator

import pytest

from megatron_pc.driver.evaluation import Evaluator, prompt_stderr
from megatron_pc.driver.prepare import RunData, ValidationData
from megatron_pc.config import load_config
from megatron_pc.data.config import DataConfig, ValidationSet
from megatron_pc.data.loading import load_prompt_sets, load_prompts
from megatron_pc.data.records import PromptRecord
from megatron_pc.errors import ConfigError
from megatron_pc.metrics.config import LoggingConfig
from megatron_pc.metrics.logger import open_metrics, read_metrics
from megatron_pc.reward.config import RewardConfig
from megatron_pc.reward.pool import RewardPool
from megatron_pc.rollout.base import GenerationRequest, GenerationResult, Sample, SamplingSettings, derive_seed


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _config_error(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_config(None, list(overrides))
    return err.value


# ---- config ------------------------------------------------------------------------------
def test_validation_keeps_none_and_a_single_path_as_they_are() -> None:
    assert load_config(None, []).data.validation is None
    assert load_config(None, ["data.validation=data/v.jsonl"]).data.validation == "data/v.jsonl"


def test_a_list_of_paths_and_mappings_becomes_validation_sets_named_by_stem(tmp_path: Path) -> None:
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(
        "data:\n"
        "  validation:\n"
        "    - data/math500.jsonl\n"
        "    - {path: data/aime.parquet, name: aime-24, n: 8, temperature: 0.6, top_p: 0.95}\n"
        "    - {path: data/gsm.v2.jsonl, n: 2}\n"
    )
    sets = load_config(experiment).data.validation
    assert sets == [
        ValidationSet("data/math500.jsonl", "math500"),
        ValidationSet("data/aime.parquet", "aime-24", n=8, temperature=0.6, top_p=0.95),
        ValidationSet("data/gsm.v2.jsonl", "gsm.v2", n=2),
    ]


def test_validation_set_errors_name_the_item_and_its_field() -> None:
    cases = {
        "data.validation=[a.jsonl, {path: b.jsonl, n: 0}]": ("data.validation[1].n", "must be >= 1"),
        "data.validation=[a.jsonl, {path: x/a.parquet}]": ("data.validation[1].name", "unique"),
        "data.validation=[a.jsonl, b.csv]": ("data.validation[1].path", ".jsonl or .parquet"),
        "data.validation=[{path: b.jsonl, top_p: 0}]": ("data.validation[0].top_p", "(0, 1]"),
        "data.validation=[{path: b.jsonl, temperature: -0.5}]": ("data.validation[0].temperature", ">= 0"),
        "data.validation=[{path: b.jsonl, name: a/b}]": ("data.validation[0].name", "letters, digits"),
        "data.validation=[{path: b.jsonl, nn: 2}]": ("data.validation[0].nn", "did you mean validation[0].n"),
        "data.validation=[{path: b.jsonl, n: two}]": ("data.validation[0].n", "integer"),
        "data.validation=[{name: b}]": ("data.validation[0].path", "required"),
        "data.validation=[3]": ("data.validation[0]", "file path or a mapping"),
        "data.validation=[]": ("data.validation", "at least one"),
    }
    for override, (field, rule) in cases.items():
        err = _config_error(override)
        assert (err.field, rule in err.rule) == (field, True), (override, str(err))


def test_a_file_stem_that_cannot_be_a_metric_name_asks_for_an_explicit_name() -> None:
    err = _config_error('data.validation=["my set.jsonl"]')
    assert err.field == "data.validation[0].name" and "set name explicitly" in err.rule
    assert load_config(None, ['data.validation=[{path: "my set.jsonl", name: my_set}]']).data.validation[0].name == "my_set"


# ---- loading -----------------------------------------------------------------------------
def test_train_records_sharing_an_id_or_prompt_with_any_set_are_dropped(tmp_path: Path) -> None:
    pool = _write_jsonl(tmp_path / "train.jsonl", [{"id": f"p{i}", "prompt": f"q{i}", "answer": "1"} for i in range(8)])
    a = _write_jsonl(tmp_path / "a.jsonl", [{"id": "p1", "prompt": "other", "answer": "1"}])  # same id as p1
    b = _write_jsonl(tmp_path / "b.jsonl", [{"id": "b0", "prompt": "q5", "answer": "1"}, {"id": "b1", "prompt": "q6", "answer": "1"}])
    cfg = DataConfig(source=str(pool), validation=[str(a), {"path": str(b), "name": "bee", "n": 2}])
    train, sets = load_prompt_sets(cfg, seed=0)
    assert [r.id for r in train] == ["p0", "p2", "p3", "p4", "p7"]
    assert {name: [r.id for r in records] for name, records in sets.items()} == {"a": ["p1"], "bee": ["b0", "b1"]}
    assert load_prompts(cfg, seed=0) == (train, [*sets["a"], *sets["bee"]])


def test_builtin_source_with_validation_sets_draws_only_train_size_prompts(tmp_path: Path) -> None:
    from megatron_pc.data.arithmetic import arithmetic_prompts

    drawn = arithmetic_prompts(50, seed=7)
    a = _write_jsonl(tmp_path / "a.jsonl", [r.to_row() for r in drawn[:3]])
    b = _write_jsonl(tmp_path / "b.jsonl", [r.to_row() for r in drawn[3:4]])
    train, sets = load_prompt_sets(DataConfig(source="builtin:arithmetic", train_size=50, validation=[str(a), str(b)]), seed=7)
    assert len(train) == 46 and [len(v) for v in sets.values()] == [3, 1]


def test_split_and_single_file_forms_give_one_set(tmp_path: Path) -> None:
    _, split = load_prompt_sets(DataConfig(source="builtin:arithmetic", train_size=20, validation_size=5), seed=1)
    assert list(split) == ["validation"] and len(split["validation"]) == 5
    v = _write_jsonl(tmp_path / "held.jsonl", [{"id": "v", "prompt": "1+1=", "answer": "2"}])
    _, single = load_prompt_sets(DataConfig(source="builtin:arithmetic", train_size=20, validation=str(v)), seed=1)
    assert [(name, [r.id for r in records]) for name, records in single.items()] == [("held", ["v"])]


# ---- evaluation ----------------------------------------------------------------------------
class FakeEngines:
    """Answers "7" to sample k of a prompt whose first token is c iff k < c (greedy: iff c > 0),
    "8" otherwise; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[GenerationRequest], SamplingSettings]] = []

    def generate(self, requests: list[GenerationRequest], sampling: SamplingSettings) -> GenerationResult:
        self.calls.append((requests, sampling))
        samples = []
        for r in requests:
            right = [k < r.prompt_token_ids[0] for k in range(r.n)] if sampling.temperature > 0 else [r.prompt_token_ids[0] > 0]
            samples.append([Sample([ord("7" if ok else "8")], [0.0], "stop") for ok in right])
        return GenerationResult(samples)


class CharTokenizer:
    """Token id = character code."""

    def batch_decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return ["".join(chr(i) for i in seq) for seq in ids]


@pytest.fixture(scope="module")
def rewards() -> Iterator[RewardPool]:
    with RewardPool(RewardConfig(function="exact_int", workers=1)) as pool:
        yield pool


def _run_data(sets: dict[str, list[int]]) -> RunData:
    val_sets = [ValidationData(name, [PromptRecord(f"{name}{i}", f"q{i}", "7") for i in range(len(c))], [[x] for x in c]) for name, c in sets.items()]
    val = [r for s in val_sets for r in s.records]
    return RunData(Path("model"), CharTokenizer(), [], val, [], [t for s in val_sets for t in s.tokens], val_sets)


def test_each_set_is_sampled_with_its_settings_and_the_headline_is_the_mean(rewards: RewardPool) -> None:
    cfg = load_config(None, [
        "training.val_samples=3", "rollout.temperature=0.9", "rollout.top_p=0.8",
        "data.validation=[a.jsonl, {path: b.jsonl, n: 2, top_p: 0.7, temperature: 0.5}]",
    ])
    engines = FakeEngines()
    metrics = Evaluator(cfg, _run_data({"a": [2, 0], "b": [1, 2, 2]}), engines, rewards).run(step=0)

    sampled = [(len(reqs), reqs[0].n, s.temperature, s.top_p, s.seed) for reqs, s in engines.calls if s.seed is not None]
    assert sampled == [(2, 3, 0.9, 0.8, derive_seed(cfg.seed, "validation", "a")), (3, 2, 0.5, 0.7, derive_seed(cfg.seed, "validation", "b"))]
    assert [s.temperature for _, s in engines.calls if s.seed is None] == [0.0, 0.0]  # one greedy pass per set
    assert metrics["val/a/accuracy"] == pytest.approx(1 / 3)  # 2 of 3, 0 of 3
    assert metrics["val/b/accuracy"] == pytest.approx(5 / 6)  # 1 of 2, 2 of 2, 2 of 2
    assert (metrics["val/a/greedy_accuracy"], metrics["val/b/greedy_accuracy"]) == (0.5, 1.0)
    assert metrics["val/b/reward_mean"] == pytest.approx(5 / 6)
    assert metrics["val_accuracy"] == pytest.approx((1 / 3 + 5 / 6) / 2)
    assert metrics["val_greedy_accuracy"] == 0.75
    assert metrics["val_reward_mean"] == pytest.approx((1 / 3 + 5 / 6) / 2)
    assert metrics["val/a/accuracy_stderr"] == pytest.approx(1 / 3)  # std(2/3, 0) / sqrt(2)
    se_b = prompt_stderr([0.5, 1.0, 1.0])
    assert metrics["val_accuracy_stderr"] == pytest.approx(math.sqrt((1 / 3) ** 2 + se_b**2) / 2)


def test_the_single_set_forms_report_the_headline_and_at_k_metrics_with_the_old_seed(rewards: RewardPool) -> None:
    cfg = load_config(None, ["training.val_samples=2"])
    engines = FakeEngines()
    metrics = Evaluator(cfg, _run_data({"validation": [1, 2, 0, 2]}), engines, rewards).run(step=3)
    at_k = {f"val/validation/{k}" for k in ("mean@2", "pass@1", "pass@2", "maj@1", "maj@2")}
    assert set(metrics) == {"val_accuracy", "val_accuracy_stderr", "val_greedy_accuracy", "val_reward_mean"} | at_k
    assert metrics["val/validation/mean@2"] == metrics["val/validation/pass@1"] == pytest.approx(5 / 8)
    assert metrics["val_accuracy"] == pytest.approx(5 / 8) and metrics["val_greedy_accuracy"] == 0.75
    assert metrics["val_accuracy_stderr"] == pytest.approx(prompt_stderr([0.5, 1.0, 0.0, 1.0]))
    reqs, sampling = engines.calls[0]
    assert (len(reqs), reqs[0].n, sampling.seed) == (4, 2, derive_seed(cfg.seed, "validation"))


def test_prompt_stderr_matches_the_binomial_formula_for_one_sample_per_prompt() -> None:
    outcomes = [1.0] * 6 + [0.0] * 4
    p = 0.6
    assert prompt_stderr(outcomes) == pytest.approx(math.sqrt(p * (1 - p) / (len(outcomes) - 1)))
    assert math.isnan(prompt_stderr([1.0]))


# ---- metrics -------------------------------------------------------------------------------
def test_metric_names_with_slashes_reach_jsonl_tensorboard_and_the_progress_bar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sinks = open_metrics(LoggingConfig(), tmp_path, "run", total_steps=2, resume_step=None, config={})
    sinks.log(1, {"val/math-500/accuracy": 0.5, "val/aime.24/accuracy": 0.25, "val_accuracy": 0.375})
    sinks.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "val/math-500/accuracy": 0.5, "val/aime.24/accuracy": 0.25, "val_accuracy": 0.375}]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert {"val/math-500/accuracy", "val/aime.24/accuracy", "val_accuracy"} <= set(events.Tags()["scalars"])
    assert [e.value for e in events.Scalars("val/aime.24/accuracy")] == [0.25]
    assert "val=0.375" in capsys.readouterr().err


def test_without_greedy_only_the_sampled_pass_runs_and_no_greedy_figure_is_reported(rewards: RewardPool, tmp_path: Path) -> None:
    cfg = load_config(None, ["training.val_samples=2", "training.val_greedy=false"])
    engines = FakeEngines()
    evaluator = Evaluator(cfg, _run_data({"validation": [1, 2, 0, 2]}), engines, rewards, answers_dir=tmp_path)
    metrics = evaluator.run(step=3)
    assert [s.seed is None for _, s in engines.calls] == [False]  # the sampled pass only
    assert not any("greedy" in key for key in metrics)
    assert metrics["val_accuracy"] == pytest.approx(5 / 8)
    rows = [json.loads(line) for line in (tmp_path / "step_3_validation.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(r["sample"] != "greedy" for r in rows)
