"""A strategy says what it needs; callers ask it instead of comparing its name."""

from __future__ import annotations

import pytest

from megatron_pc.allocation import STRATEGIES, build_strategy
from megatron_pc.config import load_config
from megatron_pc.errors import ConfigError


def _cfg(strategy: str, *overrides: str):
    return load_config(None, [f"allocation.strategy={strategy}", "allocation.n=8", "allocation.pilot.n=2", *overrides])


def test_rollouts_per_call_are_a_commits_for_pilot_commit_and_the_group_for_the_others() -> None:
    pc = _cfg("pilot_commit").allocation
    assert STRATEGIES["pilot_commit"].rollouts_per_call(pc) == pc.commit_rollouts < pc.n
    for name in ("grpo", "dapo", "greso", "mopps"):
        assert STRATEGIES[name].rollouts_per_call(_cfg(name).allocation) == 8
    assert STRATEGIES["speed_rl"].rollouts_per_call(_cfg("speed_rl").allocation) == 8 - 4


def test_dapo_and_greso_drop_uniform_groups_and_grpo_and_mopps_train_the_full_batch() -> None:
    assert [n for n, s in STRATEGIES.items() if s.drops_uniform_groups] == ["dapo", "greso"]
    assert [n for n, s in STRATEGIES.items() if s.trains_full_batch] == ["grpo", "mopps"]
    assert [n for n, s in STRATEGIES.items() if s.evicts] == ["pilot_commit"]


def test_a_pool_smaller_than_one_dapo_round_is_refused_by_dapo_itself() -> None:
    cfg = _cfg("dapo", "allocation.train_batch=4", "allocation.dapo_batch=12").allocation
    with pytest.raises(ConfigError, match="fewer than one DAPO round draws \\(12\\)"):
        build_strategy(cfg, pool_size=8, seed=0)
    build_strategy(_cfg("grpo", "allocation.train_batch=4").allocation, pool_size=8, seed=0)


def test_placement_and_world_size_are_asked_of_their_owners() -> None:
    cfg = load_config(None, ["cluster.placement=split", "cluster.data_parallel=2"])
    assert not cfg.cluster.colocated and load_config(None, []).cluster.colocated
    assert cfg.policy_world == cfg.model.tensor_parallel * cfg.model.pipeline_parallel * 2
