"""The one list of a step's phases (megatron_pc.metrics.phases) and the timer that enforces it."""

from __future__ import annotations

import pytest

from megatron_pc.driver import faults
from megatron_pc.metrics.phases import BREAKDOWN_PHASES, FAULT_PHASES, FLOP_PHASES, GENERATION_PHASES, PHASES, subset
from megatron_pc.metrics.timing import GenerationTally, Timer
from megatron_pc.rollout.base import GenerationResult, Sample


def test_the_timer_refuses_a_phase_name_that_is_not_a_steps() -> None:
    timer = Timer()
    with timer("update"), timer("total"):
        pass
    assert set(timer.seconds) == {"update", "total"}
    with pytest.raises(ValueError, match="'updates' is not a phase of a step"):
        with timer("updates"):
            pass


def test_the_timer_tells_the_fault_hook_each_phase_it_enters() -> None:
    entered: list[str] = []
    timer = Timer(on_enter=entered.append)
    for phase in ("generate", "reward", "generate"):
        with timer(phase):
            pass
    assert entered == ["generate", "reward", "generate"] and timer.only(GENERATION_PHASES).keys() == {"generate", "reward"}


def test_every_reader_of_phases_takes_a_subset_of_the_one_list_in_its_order() -> None:
    for part in (FAULT_PHASES, FLOP_PHASES, BREAKDOWN_PHASES, GENERATION_PHASES):
        assert list(part) == [p for p in PHASES if p in part]
    assert faults.PHASES == FAULT_PHASES == ("generate", "reward", "logprob", "update", "sync", "validation", "checkpoint")
    assert FLOP_PHASES == ("generate", "logprob", "reference", "update")
    with pytest.raises(ValueError, match="not phases of a step: \\['train'\\]"):
        subset("update", "train")


def test_a_rounds_attention_pairs_count_each_prefill_once_and_every_sample_against_its_context() -> None:
    tally = GenerationTally()
    out = GenerationResult([[Sample([1, 2], [0.0, 0.0], "stop"), Sample([3], [0.0], "length")]], prompt_tokens=4, generated_tokens=3)
    tally.add_round([4], out, calls=1)
    # prefill 4^2/2 = 8; sample of 2: 4*2 + 2 = 10; sample of 1: 4 + 0.5
    assert tally.pairs == 8 + 10 + 4.5 and (tally.tokens, tally.calls, tally.prompt_tokens) == (3, 1, 4)
    assert tally.metrics()["truncated_share"] == 0.5 and tally.metrics()["response_length_max"] == 2.0
