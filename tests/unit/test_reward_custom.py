"""Your own reward function (verl's compute_score) through the real reward pool: float and dict
returns, routing by data source, the success threshold, failures graded 0 and counted, and
functions that cannot load refused before anything starts."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from megatron_pc.config import load_config
from megatron_pc.driver.prepare import prepare
from megatron_pc.driver.scoring import reward_metrics
from megatron_pc.errors import ConfigError
from megatron_pc.reward.config import RewardConfig
from megatron_pc.reward.pool import RewardPool, reward_faults

REWARD_FILE = '''
import math

def compute_score(data_source, solution_str, ground_truth, extra_info):
    """0.5 for the right digit anywhere, 1.0 when the response is exactly the answer."""
    if solution_str == "raise":
        raise ValueError("cannot grade " + solution_str)
    if solution_str == "text":
        return "not a number"
    if solution_str == "nan":
        return math.nan
    if solution_str == "noscore":
        return {"acc": 1.0}
    score = 1.0 if solution_str == ground_truth else 0.5 if ground_truth in solution_str else 0.0
    if data_source == "dict":
        return {"score": score, "length": len(solution_str), "source_id": extra_info.get("id", "-"), "pred": solution_str}
    return score
'''


@pytest.fixture()
def reward_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(textwrap.dedent(REWARD_FILE))
    return path


@pytest.fixture()
def pool(reward_file: Path) -> Iterator[RewardPool]:
    cfg = RewardConfig(function=f"{reward_file}:compute_score", workers=2, by_source={"ints": "exact_int"}, success_threshold=0.5)
    with RewardPool(cfg) as p:
        yield p


def test_float_and_dict_returns_become_rewards_successes_and_metrics(pool: RewardPool) -> None:
    results = pool.score(["7", "x7", "no", "7", "ab7"], ["7"] * 5, sources=["float", "float", "float", "dict", "dict"],
                         extra_infos=[{"id": f"p{i}"} for i in range(5)])  # fmt: skip
    assert [(r.reward, r.correct, r.reason) for r in results] == [
        (1.0, True, "correct"), (0.5, True, "correct"), (0.0, False, "incorrect"), (1.0, True, "correct"), (0.5, True, "correct")]
    # Only the numbers of a dict become metrics (the string keys stay out).
    assert [dict(r.metrics) for r in results] == [{}, {}, {}, {"length": 1.0}, {"length": 3.0}]
    assert reward_metrics([r.metrics for r in results]) == {"reward/length": 2.0}


def test_a_threshold_above_the_score_makes_it_a_failure_with_the_same_reward(reward_file: Path) -> None:
    with RewardPool(RewardConfig(function=f"{reward_file}:compute_score", workers=1)) as strict:
        r = strict.score(["x7"], ["7"])[0]
    assert (r.reward, r.correct) == (0.5, False)


def test_by_source_routes_to_a_built_in_grader_and_the_rest_to_the_function(pool: RewardPool) -> None:
    results = pool.score(["the answer is 7", "the answer is 7"], ["7", "7"], sources=["ints", None])
    assert [(r.reward, r.reason) for r in results] == [(1.0, "correct"), (0.5, "correct")]


def test_a_function_that_raises_or_returns_no_number_is_graded_0_counted_and_logged_once(
        pool: RewardPool, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    before = dict(pool.counters)
    with caplog.at_level(logging.WARNING, logger="megatron_pc.reward.pool"):
        results = pool.score(["raise", "text", "nan", "noscore", "raise", "7"], ["7"] * 6, sources=["float"] * 6)
    assert [(r.reward, r.correct) for r in results] == [(0.0, False)] * 5 + [(1.0, True)]
    assert [r.reason for r in results[:5]] == ["error:ValueError", "error:bad_return", "error:bad_return", "error:bad_return", "error:ValueError"]
    assert reward_faults(before, pool.counters) == {"reward_timeouts": 0, "reward_errors": 5, "reward_worker_restarts": 0}
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2, logged  # once per kind of failure, not once per response
    assert "my_reward.py:compute_score: error:ValueError (cannot grade raise)" in logged[0]
    assert "returned str 'not a number', not a finite number" in logged[1]
    assert pool.alive_workers() == 2  # a raising function does not cost a worker


def test_a_slow_function_times_out_like_a_built_in_grader(tmp_path: Path) -> None:
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    time.sleep(30)\n    return 1.0\n")
    with RewardPool(RewardConfig(function=f"{slow}:compute_score", workers=1, timeout_s=0.5)) as p:
        r = p.score(["7"], ["7"])[0]
        assert (r.reward, r.reason, p.counters["worker_restarts"]) == (0.0, "timeout", 1)


def test_a_module_function_is_found_on_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "task_rewards").mkdir()
    (tmp_path / "task_rewards" / "__init__.py").write_text("")
    (tmp_path / "task_rewards" / "gsm.py").write_text("def score(data_source, solution_str, ground_truth, extra_info):\n    return 0.25\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with RewardPool(RewardConfig(function="task_rewards.gsm:score", workers=1)) as p:
        assert p.score(["x"], ["y"])[0].reward == 0.25


@pytest.mark.parametrize(("spec", "message"), [
    ("no_such_module_xyz:score", "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    ("{dir}/missing.py:score", "ImportError: file {dir}/missing.py does not exist"),
    ("{dir}/broken.py:score", "SyntaxError"),
    ("{dir}/my_reward.py:nothing", "AttributeError: {dir}/my_reward.py has no attribute 'nothing'"),
    ("{dir}/my_reward.py:math", "TypeError: {dir}/my_reward.py:math is a module, not a function"),
    ("{dir}/two_args.py:score", "cannot be called as compute_score(data_source, solution_str, ground_truth, extra_info)"),
])  # fmt: skip
def test_a_function_that_cannot_load_is_refused_at_start_naming_it(reward_file: Path, spec: str, message: str) -> None:
    folder = reward_file.parent
    (folder / "broken.py").write_text("def score(:\n")
    (folder / "two_args.py").write_text("def score(response, answer):\n    return 1.0\n")
    spec, message = spec.format(dir=folder), message.format(dir=folder)
    cfg = RewardConfig(function="exact_int", by_source={"gsm8k": spec})
    with pytest.raises(ConfigError) as err:
        RewardPool(cfg)
    assert err.value.field == "reward.by_source.gsm8k"
    assert f"reward function {spec!r} cannot be loaded" in err.value.rule and message in err.value.rule


def test_the_run_refuses_a_broken_function_before_any_model_is_touched(tmp_path: Path) -> None:
    cfg = load_config(None, ["reward.function=no_such_module_xyz:score", f"model.path={tmp_path / 'no_model'}"])
    with pytest.raises(ConfigError, match=r"^reward\.function: reward function 'no_such_module_xyz:score' cannot be loaded"):
        prepare(cfg)


def test_a_spec_of_neither_form_is_a_config_error_saying_the_forms() -> None:
    for override, field in [("reward.function=exact", "reward.function"), ("reward.by_source.gsm=a b:c", "reward.by_source.gsm"),
                            ("reward.function=mod:1fn", "reward.function")]:  # fmt: skip
        with pytest.raises(ConfigError) as err:
            load_config(None, [override])
        assert err.value.field == field and ("'module:function' or 'path/to/file.py:function'" in err.value.rule or "neither" in err.value.rule)
    assert load_config(None, ["reward.function=math_verify"]).reward.function == "math_verify"
