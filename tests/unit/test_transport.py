"""Weight-sync transports, the pure parts: bucket layout, packing, and which transport a run
gets (rollout.weight_transport). The multi-process broadcast is in
tests/integration/test_transport_broadcast.py."""

from __future__ import annotations

import pytest
import torch

from megatron_pc.config import load_config
from megatron_pc.errors import ConfigError
from megatron_pc.rollout.config import RolloutConfig
from megatron_pc.weight_sync.buckets import ALIGN, TensorMeta, TransportError, bucket_meta, layout, pack, unpack


def _bucket() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    weird = torch.tensor([float("nan"), -0.0, float("inf"), 1e-45])  # bits a value compare would miss
    return [
        ("model.embed_tokens.weight", torch.randn(7, 5, generator=gen)),
        ("model.layers.0.self_attn.q_proj.weight", torch.randn(3, 5, generator=gen).to(torch.bfloat16)),
        ("model.layers.0.input_layernorm.weight", torch.randn(5, generator=gen).half()),
        ("transposed", torch.randn(4, 6, generator=gen).t()),  # not contiguous
        ("scalar", torch.tensor(3.5, dtype=torch.float64)),
        ("empty", torch.empty(0, 3)),
        ("ids", torch.arange(-5, 6, dtype=torch.int64)),
        ("mask", torch.tensor([True, False, True])),
        ("bytes", torch.tensor([1, 255, 7], dtype=torch.uint8)),
        ("weird", weird),
    ]


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_pack_then_unpack_gives_back_every_name_shape_dtype_and_bit_in_order() -> None:
    bucket = _bucket()
    meta, buffer = pack(bucket)
    pairs = unpack(meta, buffer)
    assert [n for n, _ in pairs] == [n for n, _ in bucket]
    for (_, got), (name, want) in zip(pairs, bucket):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert _bits(got) == _bits(want), name


def test_metadata_is_plain_name_shape_dtype_and_rebuilds_the_layout() -> None:
    bucket = _bucket()
    meta = bucket_meta(bucket)
    assert meta[1] == ("model.layers.0.self_attn.q_proj.weight", (3, 5), "torch.bfloat16")
    assert meta[4] == TensorMeta("scalar", (), "torch.float64")
    offsets, total = layout(meta)
    assert all(o % ALIGN == 0 for o in offsets)
    assert all(a + m.nbytes <= b for a, b, m in zip(offsets, offsets[1:], meta))  # no overlap
    assert total == offsets[-1] + meta[-1].nbytes == pack(bucket)[1].numel()


def test_unpack_refuses_a_buffer_of_the_wrong_size() -> None:
    meta, buffer = pack(_bucket())
    with pytest.raises(TransportError, match="buffer of"):
        unpack(meta, buffer[:-1])


def test_unknown_dtype_in_metadata_names_the_tensor() -> None:
    with pytest.raises(TransportError, match="tensor w: unknown dtype"):
        layout([TensorMeta("w", (2,), "torch.float77")])


@pytest.mark.parametrize(
    ("gpu", "colocated", "engines", "expected"),
    [
        (False, True, 1, "object_store"),
        (False, False, 2, "object_store"),
        (True, True, 1, "cuda_ipc"),
        (True, True, 2, "cuda_ipc"),  # per GPU: every policy rank feeds the engine worker on its GPU
        (True, False, 2, "broadcast"),
    ],
)
def test_auto_picks_the_transport_for_the_devices_and_placement(gpu: bool, colocated: bool, engines: int, expected: str) -> None:
    assert RolloutConfig(engines=engines).resolve_transport(use_gpu=gpu, colocated=colocated) == expected


def test_an_explicit_transport_is_kept_where_it_works() -> None:
    assert RolloutConfig(weight_transport="broadcast").resolve_transport(use_gpu=False, colocated=True) == "broadcast"
    assert RolloutConfig(weight_transport="broadcast").resolve_transport(use_gpu=True, colocated=False) == "broadcast"
    assert RolloutConfig(weight_transport="object_store").resolve_transport(use_gpu=True, colocated=True) == "object_store"


def test_cuda_ipc_without_gpus_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError) as info:
        RolloutConfig(weight_transport="cuda_ipc").resolve_transport(use_gpu=False, colocated=True)
    assert info.value.field == "rollout.weight_transport" and "needs GPUs" in str(info.value)


def test_nccl_broadcast_colocated_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        RolloutConfig(weight_transport="broadcast").resolve_transport(use_gpu=True, colocated=True)
    assert info.value.field == "rollout.weight_transport" and "placement=split" in str(info.value)


def test_config_refuses_cuda_ipc_in_split_placement_or_with_pipeline_stages_and_takes_any_engine_tp() -> None:
    cases = [
        (["rollout.weight_transport=cuda_ipc", "cluster.placement=split"], "colocated"),
        (["rollout.weight_transport=cuda_ipc", "model.pipeline_parallel=2"], "pipeline_parallel 1"),
    ]
    for overrides, words in cases:
        with pytest.raises(ConfigError) as info:
            load_config(None, overrides)
        assert info.value.field == "rollout.weight_transport", str(info.value)
        assert words in str(info.value)
    assert load_config(None, ["rollout.weight_transport=broadcast", "cluster.placement=split"]).rollout.weight_transport == "broadcast"
    # every vLLM worker receives for itself: engines of TP 2 take every transport
    assert load_config(None, ["rollout.weight_transport=broadcast", "rollout.tensor_parallel=2"]).rollout.tensor_parallel == 2
    assert load_config(None, ["rollout.weight_transport=cuda_ipc", "rollout.engines=2", "allocation.pilot.batch=24"]).rollout.engines == 2
    assert RolloutConfig().resolve_transport(use_gpu=True, colocated=True, pipeline_parallel=2) == "object_store"


def test_buckets_never_split_a_decoder_layer_between_two_engine_reloads() -> None:
    from megatron_pc.weight_sync.buckets import buckets_by_layer, weight_unit

    names = ["model.embed_tokens.weight"]
    for layer in range(4):
        names += [f"model.layers.{layer}.{w}.weight" for w in
                  ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                   "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]  # fmt: skip
    names += ["model.norm.weight", "lm_head.weight"]
    named = [(n, torch.zeros(4)) for n in names]  # 16 bytes each
    buckets = list(buckets_by_layer(named, bucket_bytes=40))  # smaller than one layer (144 bytes)
    assert [n for b in buckets for n, _ in b] == names  # everything, once, in order
    units = [{weight_unit(n) for n, _ in b} for b in buckets]
    for a, b in zip(units, units[1:]):
        assert not a & b, f"a unit is split between buckets: {a & b}"
    assert len(buckets) >= 4  # one layer is over the size: the layers go in buckets of their own
    assert len(list(buckets_by_layer(named, bucket_bytes=10**9))) == 1
    assert weight_unit("model.layers.12.self_attn.qkv_proj.weight") == "model.layers.12"
    assert weight_unit("lm_head.weight") == "lm_head"


def test_transports_are_registered_by_exact_name_each_with_its_sender_and_receiver_type() -> None:
    from megatron_pc.weight_sync.broadcast import BroadcastReceiver, BroadcastSender
    from megatron_pc.weight_sync.object_store import ObjectStoreReceiver, ObjectStoreSender
    from megatron_pc.weight_sync.transports import TRANSPORTS, get_transport

    assert list(TRANSPORTS) == ["object_store", "broadcast", "cuda_ipc"]
    assert (get_transport("broadcast").sender, get_transport("broadcast").receiver) == (BroadcastSender, BroadcastReceiver)
    assert (get_transport("object_store").sender, get_transport("object_store").receiver) == (ObjectStoreSender, ObjectStoreReceiver)
    assert all(t.sender.transport == t.receiver.transport == name for name, t in TRANSPORTS.items())
    with pytest.raises(TransportError, match="unknown weight transport 'Broadcast': one of object_store, broadcast, cuda_ipc"):
        get_transport("Broadcast")


def test_receiver_names_are_the_engine_or_one_per_worker() -> None:
    from megatron_pc.weight_sync.channel import receiver_names

    assert receiver_names("engine3", 1) == ["engine3"]
    assert receiver_names("engine0", 2) == ["engine0.tp0", "engine0.tp1"]


def test_a_per_gpu_bucket_gives_each_worker_the_share_on_its_gpu_and_refuses_mixed_buckets() -> None:
    from megatron_pc.weight_sync.channel import ChannelSpec
    from megatron_pc.weight_sync.cuda_ipc import PerGpuBucket, SharedBucket

    meta = bucket_meta([("model.layers.0.mlp.up_proj.weight", torch.zeros(4, 2))])
    shares = [SharedBucket(3, 5, meta, ("rebuild", (gpu,)), f"GPU-{gpu}") for gpu in "ab"]
    bucket = PerGpuBucket.of(shares)
    assert (bucket.sync, bucket.index, bucket.meta) == (3, 5, meta)
    assert bucket.on("GPU-b", "engine0.tp1") is shares[1]
    with pytest.raises(TransportError, match="engine0.tp0: no policy rank shared weight bucket 5 on this worker's GPU GPU-c"):
        bucket.on("GPU-c", "engine0.tp0")
    with pytest.raises(TransportError, match="policy ranks shared different weight buckets at once: bucket 5"):
        PerGpuBucket.of([shares[0], SharedBucket(3, 6, meta, ("rebuild", ()), "GPU-b")])
    spec = ChannelSpec("cuda_ipc", "10.0.0.1:7", 1, 3, 60.0, {"GPU-a": "10.0.0.1:7", "GPU-b": "10.0.0.1:8"})
    assert spec.for_gpu("GPU-b", "engine0.tp1") == ChannelSpec("cuda_ipc", "10.0.0.1:8", 1, 2, 60.0)
    with pytest.raises(TransportError, match="engine0.tp0: no policy rank sends weights on this worker's GPU GPU-c"):
        spec.for_gpu("GPU-c", "engine0.tp0")
    plain = ChannelSpec("broadcast", "10.0.0.1:7", 3, 5, 60.0)
    assert plain.for_gpu("GPU-a", "engine1.tp0") is plain


def test_an_object_store_payload_of_views_into_one_buffer_pickles_to_its_own_size_not_the_buffers() -> None:
    # Megatron's distributed optimizer keeps every parameter as a view into one contiguous buffer;
    # a pickled view carries its whole storage, so a bucket of views would carry the whole model.
    import pickle

    from megatron_pc.weight_sync.object_store import ObjectStoreSender, StoredBucket
    from megatron_pc.weight_sync.rendezvous import Rendezvous

    buffer = torch.arange(1_000_000, dtype=torch.float32)
    bucket = [("model.layers.0.mlp.up_proj.weight", buffer[100:200].view(10, 10)), ("model.norm.weight", buffer[-10:])]
    sender = ObjectStoreSender(Rendezvous.__new__(Rendezvous), ["engine_0"])  # one bucket: no acknowledgement awaited
    (payload,) = list(sender._send(0, bucket))
    assert isinstance(payload, StoredBucket)
    assert [torch.equal(t, view) for t, (_, view) in zip(payload.tensors, bucket)] == [True, True]
    assert len(pickle.dumps(payload)) < 10_000  # the buffer alone is 4 MB
