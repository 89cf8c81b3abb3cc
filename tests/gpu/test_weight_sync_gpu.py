"""The GPU weight-sync transports between real processes: NCCL broadcast (two GPUs) and CUDA
IPC handoff on one GPU, tensors bit-identical; and CUDA IPC buckets loaded into a real vLLM
engine score exactly like the same weights pushed as plain tensors.

Skipped without CUDA by tests/conftest.py; everything imported at module level imports
without CUDA. The processes are spawned; the pytest process is the sender where one is enough.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.models import bits as _bits
from megatron_pc.weight_sync.buckets import TransportError
from megatron_pc.weight_sync.cuda_ipc import IpcReceiver, IpcSender
from megatron_pc.weight_sync.rendezvous import Rendezvous
from megatron_pc.weight_sync.transports import join_receiver, open_sender
from megatron_pc.training.launch import free_port

pytestmark = pytest.mark.gpu

CTX = multiprocessing.get_context("spawn")
TIMEOUT_S = 120.0


def _buckets(device: str = "cpu") -> list[list[tuple[str, torch.Tensor]]]:
    """Buckets of the dtypes a GPU policy exports (bf16 mostly), a 64 MB tensor, odd shapes
    and float bit patterns that a value comparison would miss."""
    gen = torch.Generator().manual_seed(11)
    buckets = [
        [
            ("model.embed_tokens.weight", torch.randn(4096, 4096, generator=gen).to(torch.bfloat16)),
            ("model.norm.weight", torch.tensor([float("nan"), -0.0, float("inf"), 3.0]).to(torch.bfloat16)),
            ("lm_head.weight", torch.randn(4096, 4096, generator=gen)),
        ],
        [
            ("transposed", torch.randn(96, 40, generator=gen).t()),
            ("scalar", torch.tensor(1.25, dtype=torch.float64)),
            ("empty", torch.empty(0, 16, dtype=torch.float16)),
            ("ids", torch.arange(100, dtype=torch.int64)),
        ],
    ]
    return [[(n, t.to(device)) for n, t in bucket] for bucket in buckets]


def _assert_identical(received: list, sent: list) -> None:
    assert len(received) == len(sent)
    for got, want in zip(received, sent):
        assert [n for n, _ in got] == [n for n, _ in want]
        for (name, g), (_, w) in zip(got, want):
            assert (g.dtype, tuple(g.shape)) == (w.dtype, tuple(w.shape)), name
            assert _bits(g) == _bits(w), name


def _record(path: str, fn: Any, *args: Any) -> None:
    start = time.monotonic()
    try:
        result: dict[str, Any] = {"ok": fn(*args)}
    except Exception as err:
        result = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()}
    result["seconds"] = time.monotonic() - start
    torch.save(result, path)


def _start(path: Path, fn: Any, *args: Any) -> Any:
    proc = CTX.Process(target=_record, args=(str(path), fn, *args), daemon=True)
    proc.start()
    return proc


def _join(procs: list[Any], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(5)


def _result(path: Path) -> Any:
    assert path.exists(), f"{path.name}: the process wrote no result"
    result = torch.load(path, weights_only=False)
    assert "ok" in result, result.get("trace")
    return result["ok"]


# ---- NCCL broadcast ---------------------------------------------------------------------------
def _nccl_send(port: int, queue: Any) -> None:
    torch.cuda.set_device(0)
    sender = open_sender("broadcast", "127.0.0.1", ["engine0"], device="cuda:0", timeout_s=TIMEOUT_S, port=port)
    sender.connect()
    for payload in sender.stream(_buckets("cuda:0")):  # the metadata first; the bytes follow over NCCL
        queue.put(payload)
    sender.close()


def _nccl_receive(port: int, queue: Any, count: int) -> list:
    torch.cuda.set_device(1)
    receiver = join_receiver("broadcast", f"127.0.0.1:{port}", 1, 2, "engine0", device="cuda:1", timeout_s=TIMEOUT_S)
    got = []
    for _ in range(count):
        pairs = receiver.receive(queue.get(timeout=TIMEOUT_S))
        assert all(t.device == torch.device("cuda", 1) for _, t in pairs)
        got.append([(n, t.cpu()) for n, t in pairs])
    receiver.close()
    return got


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="NCCL cannot put two ranks on one GPU: needs two GPUs")
def test_nccl_broadcast_between_two_gpus_delivers_bit_identical_buckets_in_order(tmp_path: Path) -> None:
    port, queue = free_port(), CTX.Queue()
    procs = [_start(tmp_path / "sender.pt", _nccl_send, port, queue),
             _start(tmp_path / "receiver.pt", _nccl_receive, port, queue, len(_buckets()))]
    _join(procs, 300)
    _result(tmp_path / "sender.pt")
    _assert_identical(_result(tmp_path / "receiver.pt"), _buckets())


# ---- CUDA IPC ---------------------------------------------------------------------------------
def _ipc_receive(address: str, queue: Any, count: int, acknowledge: bool) -> list:
    receiver = IpcReceiver(Rendezvous.join(address, TIMEOUT_S), 1, 2, "engine0")
    got = []
    for _ in range(count):
        shared = queue.get(timeout=TIMEOUT_S)
        pairs = receiver.receive(shared)
        got.append([(n, t.cpu()) for n, t in pairs])
        del pairs
        if acknowledge:
            receiver.done(shared)
    return got


def test_cuda_ipc_hands_buckets_to_another_process_on_the_same_gpu_bit_identical(tmp_path: Path) -> None:
    sender = IpcSender(Rendezvous.host("127.0.0.1", TIMEOUT_S), ["engine0"], window=1)
    queue = CTX.Queue()
    proc = _start(tmp_path / "receiver.pt", _ipc_receive, sender.address, queue, len(_buckets()), True)
    try:
        sender.connect()
        for payload in sender.stream(_buckets("cuda")):  # window 1: waits for the previous acknowledgement
            queue.put(payload)
    finally:
        _join([proc], 300)
    _assert_identical(_result(tmp_path / "receiver.pt"), _buckets())


def test_cuda_ipc_sender_fails_naming_the_bucket_when_the_engine_never_acknowledges(tmp_path: Path) -> None:
    sender = IpcSender(Rendezvous.host("127.0.0.1", 5.0), ["engine0"], window=1)
    queue = CTX.Queue()
    proc = _start(tmp_path / "receiver.pt", _ipc_receive, sender.address, queue, 1, False)
    try:
        sender.connect()
        bucket = _buckets("cuda")[1]
        start = time.monotonic()
        with pytest.raises(TransportError, match=r"engine0 \(rank 1\) did not acknowledge weight bucket 0 \(4 tensors"):
            for payload in sender.stream([bucket]):  # ends by waiting for the acknowledgement
                queue.put(payload)
        assert time.monotonic() - start < 30
    finally:
        _join([proc], 60)


def _per_gpu_receive(spec: Any, queue: Any, count: int) -> list:
    from megatron_pc.weight_sync.cuda_ipc import this_gpu
    from megatron_pc.weight_sync.transports import join_receiver

    mine = spec.for_gpu(this_gpu(), "engine0")  # the channel of the policy rank on this GPU
    receiver = join_receiver("cuda_ipc", mine.address, 1, mine.size, "engine0", device="cuda", timeout_s=TIMEOUT_S)
    got = []
    for _ in range(count):
        payload = queue.get(timeout=TIMEOUT_S)
        pairs = receiver.receive(payload)  # picks the share on its GPU out of the PerGpuBucket
        got.append([(n, t.cpu()) for n, t in pairs])
        del pairs
        receiver.done(payload)
    return got


def test_cuda_ipc_per_gpu_bucket_reaches_the_worker_on_that_gpu_through_its_own_channel(tmp_path: Path) -> None:
    """The per-GPU plumbing on one GPU: the worker finds its GPU's channel in the ChannelSpec and
    its GPU's share in the PerGpuBucket (beside a share of another GPU, which it must not map)."""
    from dataclasses import replace

    from megatron_pc.weight_sync.channel import ChannelSpec
    from megatron_pc.weight_sync.cuda_ipc import PerGpuBucket, this_gpu

    sender = IpcSender(Rendezvous.host("127.0.0.1", TIMEOUT_S), ["the engine worker on GPU 0"])
    spec = ChannelSpec("cuda_ipc", sender.address, 1, 2, TIMEOUT_S, {"GPU-elsewhere": "127.0.0.1:1", this_gpu(): sender.address})
    queue = CTX.Queue()
    proc = _start(tmp_path / "receiver.pt", _per_gpu_receive, spec, queue, len(_buckets()))
    try:
        sender.connect()
        for shared in sender.stream(_buckets("cuda")):
            queue.put(PerGpuBucket.of([replace(shared, device_uuid="GPU-elsewhere", handle=None), shared]))
        assert sender.stats.max_in_flight_buckets <= 2
    finally:
        _join([proc], 300)
    _assert_identical(_result(tmp_path / "receiver.pt"), _buckets())


# ---- CUDA IPC into a real vLLM engine ------------------------------------------------------------
def _perturbed(model_dir: str) -> dict[str, torch.Tensor]:
    """The model's weights moved by a fixed random step, in bf16 (what a GPU policy exports)."""
    from safetensors.torch import load_file

    state = load_file(str(Path(model_dir) / "model.safetensors"))
    gen = torch.Generator().manual_seed(5)
    return {n: (t + 0.05 * torch.randn(t.shape, generator=gen)).to(torch.bfloat16) for n, t in sorted(state.items())}


def _engine_scores(model_dir: str, spec: Any, queue: Any, count: int, seqs: list[list[int]], tp: int = 1) -> dict[str, Any]:
    """A real vLLM engine (TP ``tp``) whose workers join the per-GPU CUDA IPC channels of
    ``spec`` (each the one on its GPU) and receive ``count`` buckets themselves
    (collective_rpc), then the same weights plainly."""
    from helpers.tiny import tiny_rollout
    from megatron_pc.rollout.vllm_engine import VllmEngine

    config = tiny_rollout(dtype="bfloat16", gpu_memory_utilization=0.3, max_num_seqs=8, tensor_parallel=tp)
    engine = VllmEngine(model_dir, config, name="engine0", seed=0)
    try:
        before = engine.score(seqs)
        engine.join_weight_channel(spec)
        pushed = [engine.update_weights(queue.get(timeout=TIMEOUT_S)).bytes for _ in range(count)]
        ipc = engine.score(seqs)
        engine.update_weights(_perturbed(model_dir).items())  # the same weights, as plain CPU tensors
        plain = engine.score(seqs)
        return {"before": before, "ipc": ipc, "plain": plain, "pushed": pushed}
    finally:
        engine.shutdown()


def _ipc_into_engine(tmp_path: Path, tp: int) -> None:
    """What a colocated run does: one sender per GPU (here all in this process, as policy ranks
    0..tp-1 would be on their GPUs), each sharing every bucket on its GPU; the driver's
    PerGpuBucket of their payloads goes to the engine, each worker loads the share on its GPU."""
    pytest.importorskip("vllm")
    from megatron_pc.models.tiny import make_tiny_model
    from megatron_pc.weight_sync.channel import ChannelSpec
    from megatron_pc.weight_sync.cuda_ipc import PerGpuBucket, this_gpu

    model_dir = str(make_tiny_model(tmp_path / "tiny", warmup_steps=0, eval_prompts=2, eval_samples=1))
    weights = list(_perturbed(model_dir).items())
    seqs = [[1, 5, 9, 14, 20, 3, 7], [2, 4, 6, 8, 10, 12]]
    senders, by_gpu, streams = [], {}, []
    for gpu in range(tp):
        torch.cuda.set_device(gpu)
        sender = IpcSender(Rendezvous.host("127.0.0.1", 300.0), [f"the engine worker on GPU {gpu}"])
        senders.append(sender)
        by_gpu[this_gpu()] = sender.address
        buckets = [[(n, t.to(f"cuda:{gpu}")) for n, t in weights[i : i + 5]] for i in range(0, len(weights), 5)]
        streams.append(sender.stream(buckets))
    queue = CTX.Queue()
    spec = ChannelSpec("cuda_ipc", senders[0].address, 1, 2, TIMEOUT_S, by_gpu)
    proc = _start(tmp_path / "engine.pt", _engine_scores, model_dir, spec, queue, -(-len(weights) // 5), seqs, tp)
    try:
        for sender in senders:
            sender.connect()  # returns once the engine started and its worker on that GPU joined
        while True:  # lockstep, as the driver zips the policy ranks' streams
            shares = []
            for gpu, stream in enumerate(streams):
                torch.cuda.set_device(gpu)  # each sender packs on its own GPU
                shares.append(next(stream, None))
            if shares[0] is None:
                break
            queue.put(PerGpuBucket.of(shares))
        assert all(s.stats.max_in_flight_buckets <= 2 for s in senders)
    finally:
        _join([proc], 600)
    scores = _result(tmp_path / "engine.pt")
    assert sum(scores.pop("pushed")) == sum(t.numel() * t.element_size() for _, t in weights)
    flat = {k: [x for s in v for x in s] for k, v in scores.items()}
    assert flat["ipc"] == flat["plain"]  # same weights, same kernels: the same numbers
    assert sum(abs(a - b) for a, b in zip(flat["ipc"], flat["before"])) / len(flat["ipc"]) > 1e-2  # and they did change


def test_cuda_ipc_buckets_load_into_a_vllm_engine_like_the_same_weights_pushed_plainly(tmp_path: Path) -> None:
    _ipc_into_engine(tmp_path, tp=1)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="an engine of TP 2 needs two GPUs")
def test_cuda_ipc_buckets_reach_both_workers_of_a_tp2_engine_like_the_same_weights_pushed_plainly(tmp_path: Path) -> None:
    """Each of the engine's two vLLM workers (one per GPU) maps the buffer its GPU's sender
    shared and loads its shard; the engine scores exactly as after a plain push."""
    _ipc_into_engine(tmp_path, tp=2)
