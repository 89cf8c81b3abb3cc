"""The ``broadcast`` weight transport between real processes over gloo: one sender (policy
rank 0's role) and engine receivers, each in its own spawned process. Each bucket's payload
(its metadata) goes through a queue, as it goes through Ray in the driver; the tensors go over
the group.

No process group is mocked: the sender also holds a default process group (as a Megatron
rank does), which the weight-sync group must leave alone.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from megatron_pc.weight_sync.transports import join_receiver, open_sender
from megatron_pc.training.launch import free_port

pytestmark = pytest.mark.integration

CTX = multiprocessing.get_context("spawn")
SHORT_TIMEOUT_S = 4.0
"""Timeout of the failure tests: long enough for a loaded 2-core machine to form a group."""


def _buckets() -> list[list[tuple[str, torch.Tensor]]]:
    """Three buckets of mixed dtypes and shapes, one tensor large enough (4 MB) to overflow
    socket buffers, and float bit patterns (NaN, -0.0) that a value comparison would miss."""
    gen = torch.Generator().manual_seed(7)
    return [
        [
            ("model.embed_tokens.weight", torch.randn(1024, 1024, generator=gen)),
            ("model.layers.0.self_attn.q_proj.weight", torch.randn(64, 32, generator=gen).to(torch.bfloat16)),
            ("model.layers.0.input_layernorm.weight", torch.tensor([float("nan"), -0.0, float("inf"), 1.5]).half()),
        ],
        [
            ("model.layers.0.mlp.down_proj.weight", torch.randn(48, 24, generator=gen).t()),  # not contiguous
            ("scalar", torch.tensor(2.25, dtype=torch.float64)),
            ("empty", torch.empty(0, 8)),
            ("ids", torch.arange(-3, 40, dtype=torch.int64)),
            ("mask", torch.tensor([True, False, False, True])),
        ],
        [("lm_head.weight", torch.randn(100, 64, generator=gen))],
    ]


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _record(path: str, fn: Any, *args: Any) -> None:
    """Run ``fn`` and save its result, or its error and how long it took to fail."""
    torch.set_num_threads(1)
    start = time.monotonic()
    try:
        result: dict[str, Any] = {"ok": fn(*args)}
    except Exception as err:
        result = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()}
    result["seconds"] = time.monotonic() - start
    torch.save(result, path)


def _send(port: int, receivers: list[str], buckets: list, queues: list, timeout_s: float) -> dict[str, Any]:
    # A default process group first, as on a Megatron rank: the sync must not touch it.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    sender = open_sender("broadcast", "127.0.0.1", receivers, port=port, timeout_s=timeout_s)
    sender.connect()
    for payload in sender.stream(buckets):  # the metadata first; the bytes follow over the group
        for queue in queues:
            queue.put(payload)
    sender.close()
    one = torch.ones(1)
    dist.all_reduce(one)
    default = (dist.get_world_size(), dist.get_rank(), one.item())
    dist.destroy_process_group()
    return {"default_group": default}


def _receive(port: int, rank: int, size: int, name: str, queue: Any, buckets: int, timeout_s: float, stall: bool) -> list:
    receiver = join_receiver("broadcast", f"127.0.0.1:{port}", rank, size, name, timeout_s=timeout_s)
    if stall:  # joined, then never receives (a hung engine)
        time.sleep(120)
    got = []
    for _ in range(buckets):
        got.append([(n, t.clone()) for n, t in receiver.receive(queue.get(timeout=120))])
    receiver.close()
    return got


def _start(path: Path, fn: Any, *args: Any) -> Any:
    proc = CTX.Process(target=_record, args=(str(path), fn, *args), daemon=True)
    proc.start()
    return proc


def _finish(procs: list[Any], timeout_s: float, wait: int | None = None) -> None:
    """Wait for all processes (or only ``procs[:wait]``) up to ``timeout_s``; end the rest."""
    deadline = time.monotonic() + timeout_s
    for proc in procs[:wait]:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(5)


def _result(path: Path) -> dict[str, Any]:
    assert path.exists(), f"{path.name}: the process wrote no result (killed at the deadline?)"
    return torch.load(path, weights_only=False)


def test_buckets_of_several_dtypes_reach_every_receiver_bit_identical_and_in_order(tmp_path: Path) -> None:
    buckets, port, names = _buckets(), free_port(), ["engine0", "engine1"]
    queues = [CTX.Queue() for _ in names]
    procs = [_start(tmp_path / "sender.pt", _send, port, names, buckets, queues, 120.0)]
    procs += [_start(tmp_path / f"{n}.pt", _receive, port, k + 1, 3, n, queues[k], len(buckets), 120.0, False) for k, n in enumerate(names)]
    _finish(procs, 240)

    sender = _result(tmp_path / "sender.pt")
    assert "ok" in sender, sender.get("trace")
    assert sender["ok"]["default_group"] == (1, 0, 1.0)  # the default group is still the 1-rank one, and works
    for name in names:
        got = _result(tmp_path / f"{name}.pt")
        assert "ok" in got, got.get("trace")
        assert len(got["ok"]) == len(buckets)
        for received, sent in zip(got["ok"], buckets):
            assert [n for n, _ in received] == [n for n, _ in sent]
            for (n, r), (_, s) in zip(received, sent):
                assert (r.dtype, r.shape) == (s.dtype, s.shape), (name, n)
                assert _bits(r) == _bits(s), (name, n)


def test_a_receiver_that_never_joins_makes_the_sender_fail_naming_it_within_the_timeout(tmp_path: Path) -> None:
    port, names = free_port(), ["engine0", "engine1"]
    queue = CTX.Queue()
    procs = [
        _start(tmp_path / "sender.pt", _send, port, names, _buckets()[2:], [queue], SHORT_TIMEOUT_S),
        _start(tmp_path / "engine0.pt", _receive, port, 1, 3, "engine0", queue, 1, SHORT_TIMEOUT_S, False),
    ]  # engine1 never starts
    _finish(procs, 60, wait=1)
    sender = _result(tmp_path / "sender.pt")
    assert "error" in sender, sender
    assert "TransportError" in sender["error"] and "engine1 (rank 2) did not join" in sender["error"], sender["error"]
    assert "engine0" not in sender["error"]
    assert sender["seconds"] < SHORT_TIMEOUT_S + 10


def test_a_receiver_that_stops_receiving_makes_the_sender_fail_naming_the_bucket_within_the_timeout(tmp_path: Path) -> None:
    port, names = free_port(), ["engine0", "engine1"]
    queues = [CTX.Queue() for _ in names]
    procs = [
        _start(tmp_path / "sender.pt", _send, port, names, _buckets()[2:], queues, SHORT_TIMEOUT_S),
        _start(tmp_path / "engine0.pt", _receive, port, 1, 3, "engine0", queues[0], 1, SHORT_TIMEOUT_S, False),
        _start(tmp_path / "engine1.pt", _receive, port, 2, 3, "engine1", queues[1], 1, SHORT_TIMEOUT_S, True),
    ]
    _finish(procs, 60, wait=1)
    sender = _result(tmp_path / "sender.pt")
    assert "error" in sender, sender
    assert "broadcast of weight bucket 0 (1 tensors" in sender["error"] and "lm_head.weight" in sender["error"], sender["error"]
    assert "engine0, engine1" in sender["error"]
    assert sender["seconds"] < 2 * SHORT_TIMEOUT_S + 10
