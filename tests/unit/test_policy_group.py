"""The typed policy group (megatron_pc.cluster.policy_group, megatron_pc.cluster.verbs): every
worker verb the driver calls is a method of MegatronGroup paired with the MegatronRank method of
the same signature, its body calls that rank method and no other, and a mismatch fails at import.
No Ray is started: the checks read the classes and their source."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Sequence
from typing import Any

import pytest

from megatron_pc.cluster.policy_group import MegatronGroup
from megatron_pc.cluster.ranks import MegatronRank
from megatron_pc.cluster.verbs import VerbMismatch, mismatches, verb, verbs_of
from megatron_pc.driver.update import PolicyGroup

VERBS = {"load_rows", "old_logprobs", "ref_logprobs", "set_ref_logprobs", "train_update", "load", "load_hf",
         "offload_for_generation", "save", "logprobs", "prompt_features"}  # fmt: skip
"""The worker verbs of issue #42: each must be a typed method of the group."""


def test_every_worker_verb_is_a_group_method_paired_with_the_rank_method_of_the_same_signature() -> None:
    found = verbs_of(MegatronGroup)
    assert set(found) == VERBS
    for name, spec in found.items():
        assert spec.rank_method is getattr(MegatronRank, name)
        assert mismatches(getattr(MegatronGroup, name), spec) == []
        group, rank = inspect.signature(getattr(MegatronGroup, name)), inspect.signature(spec.rank_method)
        assert list(group.parameters) == list(rank.parameters), name


def test_every_public_rank_method_the_driver_may_call_is_a_verb_or_a_weight_sync_or_lifecycle_call() -> None:
    lifecycle = {"ready", "peak_rss", "layout", "weight_tensors", "sender_host"}
    weight_sync = {"open_weight_channel", "connect_weight_channel", "close_weight_channel", "push_weights", "weight_sync_stats"}
    public = {n for n, f in inspect.getmembers(MegatronRank, inspect.isfunction) if not n.startswith("_")}
    assert public == VERBS | lifecycle | weight_sync


def _remote_calls(fn: Any) -> set[str]:
    """The actor methods a group method calls: ``X.<name>.remote(...)`` (or ``.options``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {node.value.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in ("remote", "options") and isinstance(node.value, ast.Attribute)}  # fmt: skip


def test_each_verb_calls_its_own_rank_method_and_no_group_method_reaches_an_actor_by_a_string() -> None:
    for name in VERBS:
        assert _remote_calls(getattr(MegatronGroup, name)) == {name}, name
    source = inspect.getsource(inspect.getmodule(MegatronGroup))
    assert "getattr(" not in source


def test_the_drivers_policy_protocol_names_the_verbs_it_calls_with_the_groups_parameters() -> None:
    protocol = {n for n, f in vars(PolicyGroup).items() if inspect.isfunction(f) and not n.startswith("_")}
    assert protocol - {"put_shares"} <= VERBS
    for name in protocol:
        mine, theirs = inspect.signature(getattr(PolicyGroup, name)), inspect.signature(getattr(MegatronGroup, name))
        assert list(mine.parameters) == list(theirs.parameters), name


class Rank:
    def train(self, update: int, last: bool = False) -> dict[str, float]:
        return {}

    def take(self, rows: Any) -> int:
        return 0


def test_a_group_method_that_does_not_match_its_rank_method_fails_when_the_class_is_made() -> None:
    with pytest.raises(VerbMismatch, match=r"parameter 'last' defaults to True, the rank's to False"):
        class WrongDefault:
            @verb(Rank.train)
            def train(self, update: int, last: bool = True) -> dict[str, float]: ...

    with pytest.raises(VerbMismatch, match=r"parameters \(self, update\) against the rank's \(self, update, last\)"):
        class Missing:
            @verb(Rank.train)
            def train(self, update: int) -> dict[str, float]: ...

    with pytest.raises(VerbMismatch, match=r"parameter 'update' is str, must be int"):
        class WrongType:
            @verb(Rank.train)
            def train(self, update: str, last: bool = False) -> dict[str, float]: ...

    with pytest.raises(VerbMismatch, match=r"named 'update', the rank's method 'train'"):
        class Renamed:
            @verb(Rank.train)
            def update(self, update: int, last: bool = False) -> dict[str, float]: ...

    with pytest.raises(VerbMismatch, match=r"returns list\[int\], must return int"):
        class NotGathered:
            @verb(Rank.take, scatter="rows")
            def take(self, rows: Sequence[Any]) -> list[int]: ...

    with pytest.raises(VerbMismatch, match=r"parameter 'rows' is Any, must be Sequence\[Any\]"):
        class NotScattered:
            @verb(Rank.take, scatter="rows", gather="groups")
            def take(self, rows: Any) -> list[int]: ...


def test_a_matching_group_method_is_marked_and_listed() -> None:
    class Group:
        @verb(Rank.take, scatter="rows", gather="groups")
        def take(self, rows: Sequence[Any]) -> list[int]:
            return []

        @verb(Rank.train)
        def train(self, update: int, last: bool = False) -> dict[str, float]:
            return {}

    assert sorted(verbs_of(Group)) == ["take", "train"]
    assert verbs_of(Group)["take"].gather == "groups"
