"""Where a channel's sender and receivers meet: a TCPStore that policy rank 0 hosts, with
announcements, acknowledgements and timed waits that name who is missing."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch.distributed as dist

from megatron_pc.weight_sync.buckets import DEFAULT_TIMEOUT_S, TransportError

logger = logging.getLogger(__name__)

ABORT_POLL_S = 1.0
"""A sender waiting for acknowledgements looks for them (and for an abort) at least 20 times
in this many seconds."""


class SyncAborted(TransportError):
    """The driver aborted a sync (an engine failed in it)."""


def _td(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


class Rendezvous:
    """The key-value store of one channel: hosted by the sender, joined by the receivers.

    Receivers announce themselves (``joined/<rank>``); CUDA IPC receivers acknowledge buckets
    (``ack/<sync>/<bucket>/<rank>``); the broadcast group keeps its own keys under a prefix.
    """

    def __init__(self, store: dist.Store, address: str, timeout_s: float) -> None:
        self.store = store
        self.address = address
        self.timeout_s = timeout_s

    @classmethod
    def host(cls, host: str, timeout_s: float = DEFAULT_TIMEOUT_S, port: int = 0) -> "Rendezvous":
        """A new store listening on ``port`` (0: any free port) of this machine; ``host`` is
        the address receivers use to reach it."""
        store = dist.TCPStore(host, port, None, True, _td(timeout_s), wait_for_workers=False)
        return cls(store, f"{host}:{store.port}", timeout_s)

    @classmethod
    def join(cls, address: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> "Rendezvous":
        """Connect to the store a sender hosts at ``host:port``."""
        host, port = address.rsplit(":", 1)
        try:
            store = dist.TCPStore(host, int(port), None, False, _td(timeout_s))
        except Exception as err:  # DistStoreError / RuntimeError, depending on the failure
            raise TransportError(f"could not reach the weight-sync store at {address} within {timeout_s:.0f} s: {err}") from err
        return cls(store, address, timeout_s)

    def announce(self, rank: int, name: str) -> None:
        """Say that receiver ``rank`` (called ``name``) is here."""
        self.store.set(f"joined/{rank}", name)

    def await_receivers(self, receivers: Sequence[str]) -> None:
        """Wait until every receiver (rank k+1 is ``receivers[k]``) announced itself. Raises
        :class:`SyncAborted` soon after someone called :meth:`abort` (an engine died while joining)."""
        keys = [f"joined/{k + 1}" for k in range(len(receivers))]
        self._poll(keys, "the engine workers to join",
                   lambda missing: f"{_names(receivers, missing)} did not join the weight-sync channel at {self.address}")  # fmt: skip

    def acknowledge(self, sync: int, bucket: int, rank: int) -> None:
        """Receiver ``rank`` is done with a shared bucket."""
        self.store.set(f"ack/{sync}/{bucket}/{rank}", "1")

    def await_acks(self, sync: int, bucket: int, receivers: Sequence[str], what: str) -> None:
        """Wait until every receiver acknowledged a bucket; then forget the keys. Raises
        :class:`SyncAborted` soon after someone called :meth:`abort`."""
        keys = [f"ack/{sync}/{bucket}/{k + 1}" for k in range(len(receivers))]
        self._poll(keys, what, lambda missing: f"{_names(receivers, missing)} did not acknowledge {what}")
        for key in keys:
            self.store.delete_key(key)

    def abort(self) -> None:
        """Stop the sender's waits for acknowledgements for good (the driver calls it when an
        engine failed mid-sync: its acknowledgements will never come; a new channel follows)."""
        self.store.set("abort", "1")

    def _poll(self, keys: list[str], what: str, message: Callable[[list[int]], str]) -> None:
        """Wait until every key is set, looking for an abort in between; a TransportError
        naming the missing ones after the timeout. Polled: store.wait with a short timeout would
        log a c10d warning at every expiry, and a long one could not see the abort."""
        deadline = time.monotonic() + self.timeout_s
        pause = 0.001
        while not self.store.check(keys):
            if self.store.check(["abort"]):
                raise SyncAborted(f"weight sync aborted while waiting for {what}")
            if time.monotonic() >= deadline:
                missing = [i for i, key in enumerate(keys) if not self.store.check([key])]
                raise TransportError(f"{message(missing)} within {self.timeout_s:.0f} s")
            time.sleep(pause)
            pause = min(2 * pause, ABORT_POLL_S / 20)


def _names(receivers: Sequence[str], indices: Sequence[int]) -> str:
    return ", ".join(f"{receivers[i]} (rank {i + 1})" for i in indices)
