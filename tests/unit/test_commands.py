"""The one dispatch mechanism of ``megatron-pc`` and ``megatron-pc bench`` (megatron_pc/commands.py),
and the comma-list option parser the benchmarks share (benchmarks/options.py)."""

from __future__ import annotations

import sys
import types

import pytest

from benchmarks.cli import BENCHES
from benchmarks.options import parse_names
from megatron_pc.cli import COMMANDS
from megatron_pc.commands import CommandTable
from megatron_pc.errors import MegatronPCError


@pytest.mark.parametrize("table", [COMMANDS, BENCHES], ids=["megatron-pc", "bench"])
def test_every_command_of_both_tables_names_a_function_that_exists(table: CommandTable) -> None:
    for name in table.commands:
        assert callable(table.function(name)), name


def test_a_table_runs_the_named_command_with_the_rest_and_refuses_an_unknown_one(capsys: pytest.CaptureFixture[str]) -> None:
    table = CommandTable("prog", {"echo": ("tests_unit_commands_target:echo", "prints its args")}, footer="bye")
    target = types.ModuleType("tests_unit_commands_target")
    target.echo = lambda argv: print(*argv) or 3  # type: ignore[attr-defined]
    sys.modules["tests_unit_commands_target"] = target
    try:
        assert table.dispatch(["echo", "a", "b"]) == 3
        assert capsys.readouterr().out == "a b\n"
        assert table.dispatch(["nope"]) == 2
        assert "prog: unknown command 'nope'" in capsys.readouterr().err
        assert table.dispatch(["-h"]) == 0
        assert capsys.readouterr().out.splitlines() == ["usage: prog COMMAND [ARGS...]", "", "commands:", "  echo  prints its args", "", "bye"]
        assert table.dispatch([]) == 2
    finally:
        del sys.modules["tests_unit_commands_target"]


def test_parse_names_keeps_the_order_given_and_names_the_option_and_choices_of_an_unknown_name() -> None:
    assert parse_names(" grpo, pilot_commit ", "strategies", ("pilot_commit", "grpo")) == ["grpo", "pilot_commit"]
    with pytest.raises(MegatronPCError, match=r"^--strategies: unknown \['ppo'\]; choose from pilot_commit, grpo$"):
        parse_names("grpo,ppo", "strategies", ("pilot_commit", "grpo"))
    with pytest.raises(MegatronPCError, match="--strategies: unknown none given"):
        parse_names(" , ", "strategies", ("grpo",))


def test_parse_names_with_or_none_takes_none_or_nothing_as_no_names() -> None:
    assert parse_names("none", "variants", ("a",), or_none=True) == []
    assert parse_names("", "variants", ("a",), or_none=True) == []
    with pytest.raises(MegatronPCError, match=r"--variants: unknown \['b'\]; choose from a, or none$"):
        parse_names("a,b", "variants", ("a",), or_none=True)
