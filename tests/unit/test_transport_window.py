"""The object store's back-pressure, measured: policy rank 0's sender streams buckets while
engine workers (threads here, each with its own connection to the channel's real TCPStore)
load and acknowledge them slowly. The sender counts the bytes it has put and not yet seen
acknowledged by every receiver; that count must never exceed two buckets, and the receivers
must end up with exactly the policy's tensors."""

from __future__ import annotations

import threading
import time
from queue import Queue

import pytest
import torch

from megatron_pc.weight_sync.buckets import TransportError, buckets_by_layer
from megatron_pc.weight_sync.channel import WINDOW
from megatron_pc.weight_sync.rendezvous import SyncAborted
from megatron_pc.weight_sync.transports import join_receiver, open_sender


def _model() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    named = [("model.embed_tokens.weight", torch.randn(64, 32, generator=gen))]
    for layer in range(6):
        named += [(f"model.layers.{layer}.mlp.{w}.weight", torch.randn(32 * (layer + 1), 32, generator=gen)) for w in ("up_proj", "down_proj")]
    return named + [("lm_head.weight", torch.randn(64, 32, generator=gen))]


def _engine(address: str, rank: int, size: int, inbox: Queue, got: dict, delay_s: float) -> None:
    receiver = join_receiver("object_store", address, rank, size, f"engine{rank - 1}", timeout_s=30.0)
    while (payload := inbox.get(timeout=30)) is not None:
        pairs = receiver.receive(payload)
        time.sleep(delay_s)  # a slow load: the sender must wait for it, not run ahead
        got.update({n: t.clone() for n, t in pairs})
        receiver.done(payload)


def test_object_store_sender_keeps_at_most_two_buckets_in_flight_and_every_engine_gets_the_policys_weights() -> None:
    model = _model()
    buckets = list(buckets_by_layer(model, bucket_bytes=1))  # one bucket per layer: 8 buckets of growing size
    names = ["engine0", "engine1"]
    sender = open_sender("object_store", "127.0.0.1", names, timeout_s=30.0)
    inboxes, got = [Queue(), Queue()], [{}, {}]
    engines = [threading.Thread(target=_engine, args=(sender.address, k + 1, 3, inboxes[k], got[k], 0.02 * (k + 1))) for k in range(2)]
    for t in engines:
        t.start()
    sender.connect()
    for sync in range(2):  # the window starts afresh each sync
        for payload in sender.stream(buckets):  # what the driver does: hand each payload to every engine
            for inbox in inboxes:
                inbox.put(payload)
        stats = sender.stats
        sizes = sorted(sum(t.numel() * t.element_size() for _, t in b) for b in buckets)
        print(f"sync {sync}: {stats.buckets} buckets, {stats.bytes} B; in flight at most {stats.max_in_flight_buckets} buckets, "
              f"{stats.max_in_flight_bytes} B (two largest buckets: {sizes[-1] + sizes[-2]} B)")
        assert stats.buckets == len(buckets) == 8 and stats.bytes == sum(sizes)
        assert stats.max_in_flight_buckets == WINDOW == 2  # reached (the engines are slower), never passed
        assert all(n <= 2 for n, _ in stats.history)
        assert stats.max_in_flight_bytes <= sizes[-1] + sizes[-2]
    for inbox in inboxes:
        inbox.put(None)
    for t in engines:
        t.join(30)
    for mine in got:
        assert list(mine) == [n for n, _ in model]
        assert all(torch.equal(mine[n], t) for n, t in model)


def test_an_aborted_sync_stops_the_senders_wait_and_still_walks_every_bucket() -> None:
    from megatron_pc.weight_sync.rendezvous import Rendezvous

    sender = open_sender("object_store", "127.0.0.1", ["engine0"], timeout_s=60.0)
    receiver = join_receiver("object_store", sender.address, 1, 2, "engine0", timeout_s=10.0)
    sender.connect()
    walked = []

    def buckets():
        for k in range(5):
            walked.append(k)  # the other policy ranks gather every bucket: rank 0 must too
            yield [(f"model.layers.{k}.w", torch.zeros(4))]

    threading.Timer(0.5, lambda: Rendezvous.join(sender.address, 10.0).abort()).start()
    start = time.monotonic()
    with pytest.raises(SyncAborted, match="aborted while waiting for weight bucket 0"):
        for payload in sender.stream(buckets()):
            receiver.receive(payload)  # received, never acknowledged: an engine that died
    assert time.monotonic() - start < 10
    assert walked == [0, 1, 2, 3, 4]
    assert isinstance(SyncAborted("x"), TransportError)


@pytest.mark.parametrize("transport", ["object_store", "broadcast"])
def test_an_engine_that_dies_before_joining_does_not_hold_the_policy_rank_for_the_whole_timeout(transport: str) -> None:
    # The policy rank waits for the joins (connect); the driver aborts the channel when an
    # engine's join failed, and the rank is free at once for the next sync on a new channel
    # (before: it waited out the 600 s timeout, and the restarted engine's sync queued behind it).
    from megatron_pc.weight_sync.rendezvous import Rendezvous

    sender = open_sender(transport, "127.0.0.1", ["engine0", "engine1"], timeout_s=60.0)
    if transport == "object_store":  # one of the two joins; engine1 never does (a broadcast receiver would block in the group)
        join_receiver("object_store", sender.address, 1, 3, "engine0", timeout_s=10.0)
    threading.Timer(0.5, lambda: Rendezvous.join(sender.address, 10.0).abort()).start()
    start = time.monotonic()
    with pytest.raises(SyncAborted, match="aborted while waiting for the engine workers to join"):
        sender.connect()
    assert time.monotonic() - start < 10
