"""bench datapath: the driver's bytes and peak per step, before (lists to every rank, three
times) and after (each DP group's share once, as arrays)."""

from __future__ import annotations

import json

from benchmarks import datapath


def test_after_every_token_crosses_once_and_the_peak_stays_under_two_copies(capsys) -> None:
    assert datapath.main(["allocation.train_batch=4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sequences"] == 256 and out["ranks"] == 64 and out["data_parallel"] == 32
    copy = out["batch_copy_bytes"]
    before, after = out["before"], out["after"]
    assert {"driver_bytes_per_step", "driver_peak_bytes"} <= before.keys() & after.keys()
    # After: what is sent is about one copy of the batch (plus handles and scalars).
    assert copy <= after["driver_sent_bytes"] <= 1.1 * copy
    assert after["driver_peak_bytes"] < 2 * copy
    # Before: the global batch went to each of the 64 ranks at least twice.
    assert before["driver_sent_bytes"] > 2 * 64 * copy
    assert before["driver_peak_bytes"] > 10 * after["driver_peak_bytes"]


def test_shares_are_balanced_by_tokens_at_the_14b_shape() -> None:
    from megatron_pc.driver.update import plan_rows
    from megatron_pc.config import load_config
    from megatron_pc.training.payload import split_by_tokens

    cfg = load_config(datapath.DEFAULT_CONFIG, ["allocation.train_batch=32"])
    shape = datapath.draw_shape(cfg, 0, None)
    plan = plan_rows(datapath.make_groups(shape, 0), cfg)
    shares = split_by_tokens(plan.lengths, plan.update, len(plan.denominators), 32)
    loads = [int(plan.lengths[s].sum()) for s in shares]
    assert max(loads) <= 1.1 * min(loads), loads
