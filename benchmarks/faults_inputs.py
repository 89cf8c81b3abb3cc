"""The bad inputs of ``megatron-pc bench faults``: configs, data files, model directories and
hostile model output, each tried against the code a run uses on it.

A bad input is refused cleanly when our own error (a MegatronPCError) names the culprit: the
dotted field, the file and line, or the file and tensor; and nothing was written. Hostile
model output is refused cleanly when the reward grades it 0 within its timeout and has no side
effect. The tests fuzz the same code with hypothesis (tests/unit/test_fuzz_*.py); this is the
fixed catalogue whose counts the benchmark reports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from megatron_pc.errors import MegatronPCError

ROOT = Path(__file__).resolve().parents[1]  # the repository (benchmarks/ is top level)

BAD_OVERRIDES: list[tuple[list[str], str]] = [
    (["allocation.pilot.nn=2"], "allocation.pilot.nn"),  # unknown key
    (["allocation.train_batch=eight"], "allocation.train_batch"),  # wrong type
    (["allocation.train_batch=0"], "allocation.train_batch"),  # out of range
    (["allocation.p_lower=0.9", "allocation.p_upper=0.1"], "allocation.p_"),  # an inconsistent pair
    (["allocation.strategy=ppo"], "allocation.strategy"),
    (["training.lr=-1"], "training.lr"),
    (["rollout.temperature=nan"], "rollout.temperature"),
    (["rollout.top_p=.inf"], "rollout.top_p"),
    (["rollout.max_tokens=1e9"], "rollout.max_tokens"),
    (["model.tensor_parallel=-2"], "model.tensor_parallel"),
    (["reward.function=eval"], "reward.function"),
    (["data.source=builtin:nosuch"], "data.source"),
    (["cluster.cpu_threads=[1, 2]"], "cluster.cpu_threads"),
    (["training.steps"], "training.steps"),  # an override without a value
]

BAD_YAML: list[tuple[str, tuple[str, ...]]] = [
    # (text, what the error must name: the file where the YAML itself is bad, else the field)
    ("allocation:\n  train_batch: [1,\n", ("{path}", "line")),  # syntax
    ("- a\n- b\n", ("{path}", "mapping")),  # not a mapping at all
    ("training:\n  lr: 1e-3\n  lr: 2e-3\n", ("{path}", "'lr' appears twice")),  # a duplicated key
    ("allocation: 5\n", ("allocation",)),  # a section that is not a mapping
    ("allocation:\n  pilot:\n    n: {a: 1}\n", ("allocation.pilot.n",)),
    ("nosuch_section:\n  x: 1\n", ("nosuch_section",)),
    ("rollout:\n  temperature: .nan\n", ("rollout.temperature",)),
]

# A bad input is refused before any model is made or worker started: in seconds, not minutes.
CLI_TIMEOUT_S = 120

BAD_DATA: list[tuple[bytes, str]] = [
    (b"", "no rows"),
    (b'{"id": "a", "prompt": "1+1", "answer": "2"}\n{"id": "a", "prompt": "2+2", "answer": "4"}\n', "duplicate id"),
    (b'{"id": "a", "answer": "2"}\n', "prompt"),  # a missing field
    (b'{"id": "a", "prompt": 5, "answer": "2"}\n', "prompt"),  # a wrong type
    (b'{"id": ["a"], "prompt": "1+1", "answer": "2"}\n', "id"),
    (b'{"id": "a", "prompt": "1+1", "answer": null}\n', "answer"),
    (b'["a", "1+1", "2"]\n', "line 1"),  # not an object
    (b'{"id": "a", "prompt": "1+1", "answer": "2"\n', "line 1"),  # cut-off JSON
    (b'{"id": "a", "prompt": "\xff\xfe", "answer": "2"}\n', "line 1"),  # not UTF-8
    (b'{"id": "a", "prompt": "' + b"9" * 5_000_000 + b'", "answer": "2"', "line 1"),  # a huge, cut-off line
    (b'{"id": "a", "prompt": {"role": "user"}, "answer": "2"}\n', "prompt"),
]


def bad_inputs(tally: Any, work: Path) -> None:
    """Try every bad input; count it refused when our error names its culprit."""
    from megatron_pc.config import load_config
    from megatron_pc.data.records import read_prompts

    work.mkdir(parents=True, exist_ok=True)
    for overrides, culprit in BAD_OVERRIDES:
        _refused(tally, f"config override {' '.join(overrides)}", lambda: load_config(None, overrides), culprit)
    for i, (text, culprits) in enumerate(BAD_YAML):
        path = work / f"bad{i}.yaml"
        path.write_text(text)
        _refused(tally, f"config file {text.strip()[:40]!r}", lambda: load_config(path), *(c.format(path=path) for c in culprits))
    for i, (data, culprit) in enumerate(BAD_DATA):
        path = work / f"bad{i}.jsonl"
        path.write_bytes(data)
        _refused(tally, f"data file {data[:40]!r}{'...' if len(data) > 40 else ''}", lambda: read_prompts(path), culprit, str(path))
    _model_dirs(tally, work / "models")
    _through_the_cli(tally, work / "cli")
    _hostile_output(tally, work / "hostile")


def _refused(tally: Any, name: str, call: Callable[[], Any], *culprits: str) -> None:
    try:
        call()
    except MegatronPCError as err:
        named = all(c in str(err) for c in culprits)
        tally.add("bad_input", name, named, str(err)[:160] if named else f"the error does not name {culprits}: {err}")
    except Exception as err:  # a stray exception is not a clean refusal
        tally.add("bad_input", name, False, f"{type(err).__name__}: {err}"[:200])
    else:
        tally.add("bad_input", name, False, "accepted")


def tiny_hf_model(path: Path) -> Path:
    """A 2-layer Qwen2 (GQA 4/2, untied head), saved by transformers at ``path``."""
    import torch
    import transformers

    config = transformers.Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path, safe_serialization=True)
    return path


def _edit_tensors(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def apply(model: Path) -> None:
        from safetensors.torch import load_file, save_file

        state = load_file(str(model / "model.safetensors"))
        edit(state)
        save_file(state, str(model / "model.safetensors"))

    return apply


def _edit_config(**changes: Any) -> Callable[[Path], None]:
    def apply(model: Path) -> None:
        cfg = json.loads((model / "config.json").read_text())
        cfg.update(changes)
        (model / "config.json").write_text(json.dumps(cfg))

    return apply


K = "model.layers.1.self_attn.k_proj.weight"
MODEL_DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "a missing tensor": (_edit_tensors(lambda s: s.pop(K)), K),
    "a tensor of the wrong shape": (_edit_tensors(lambda s: s.__setitem__(K, s[K][:8].clone())), K),
    "a tensor the config leaves out": (_edit_tensors(lambda s: s.__setitem__("model.layers.2.mlp.up_proj.weight", s["model.layers.1.mlp.up_proj.weight"].clone())), "does not imply"),
    "config with more layers than the weights": (_edit_config(num_hidden_layers=3), "model.layers.2"),
    "config with fewer layers than the weights": (_edit_config(num_hidden_layers=1), "does not imply"),
    "config with another hidden size": (_edit_config(hidden_size=128), "has shape"),
    "config with another vocabulary": (_edit_config(vocab_size=100), "embed_tokens"),
    "config with heads not divisible by KV heads": (_edit_config(num_attention_heads=3), "num_key_value_heads"),
    "config with a tied head over a trained one": (_edit_config(tie_word_embeddings=True), "lm_head.weight"),
    "config without hidden_size": (_edit_config(hidden_size=None), "hidden_size"),
    "an unsupported architecture": (_edit_config(model_type="mistral"), "mistral"),
    "a cut-off weights file": (lambda m: (m / "model.safetensors").write_bytes((m / "model.safetensors").read_bytes()[:5000]), "model.safetensors"),
    "no weights file": (lambda m: (m / "model.safetensors").unlink(), "no *.safetensors"),
}


def _model_dirs(tally: Any, work: Path) -> None:
    from megatron_pc.models.hf_check import check_hf_weights

    good = tiny_hf_model(work / "good")
    for name, (damage, culprit) in MODEL_DAMAGE.items():
        bad = work / name.replace(" ", "_")
        shutil.copytree(good, bad)
        damage(bad)
        _refused(tally, f"model directory: {name}", lambda: check_hf_weights(bad), culprit)


def _through_the_cli(tally: Any, work: Path) -> None:
    """Two bad inputs through ``megatron-pc train`` itself: exit 2 before any worker starts,
    the culprit on stderr, and an existing run directory untouched."""
    model = tiny_hf_model(work / "model")
    _edit_tensors(lambda s: s.pop(K))(model)
    data = work / "bad.jsonl"
    data.write_bytes(b'{"id": "a", "prompt": "1+1", "answer": "2"}\n{"id": "a", "prompt": "2+2", "answer": "4"}\n')
    for name, args, culprit in (("a model directory missing a tensor", [f"model.path={model}"], K),
                                ("a data file with a duplicate id", [f"data.source={data}"], "duplicate id")):  # fmt: skip
        run = work / name.replace(" ", "_")
        (run / "checkpoints").mkdir(parents=True)
        (run / "metrics.jsonl").write_text('{"step": 0}\n')
        before = sorted((p.relative_to(run), p.stat().st_size) for p in run.rglob("*") if p.is_file())
        start = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", "megatron_pc", "train", *args, f"run_dir={run}"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=CLI_TIMEOUT_S)  # fmt: skip
        except subprocess.TimeoutExpired:
            tally.add("bad_input", f"megatron-pc train with {name}", False, f"not refused within {CLI_TIMEOUT_S} s")
            continue
        after = sorted((p.relative_to(run), p.stat().st_size) for p in run.rglob("*") if p.is_file() and p.name not in ("train.log", "config.yaml"))
        ok = proc.returncode == 2 and culprit in proc.stderr and after == before and "Traceback" not in proc.stderr
        tally.add("bad_input", f"megatron-pc train with {name}", ok,
                  f"exit {proc.returncode} in {time.monotonic() - start:.0f} s; " + proc.stderr.strip().splitlines()[-1][:140])  # fmt: skip


def _hostile_output(tally: Any, work: Path) -> None:
    from megatron_pc.reward import RewardConfig, RewardPool

    work.mkdir(parents=True, exist_ok=True)
    marker = work / "pwned"
    code = f"__import__('os').system('touch {marker}')"
    hostile = {
        "a power tower": "\\boxed{9^{9^{9^{9}}}}",
        "a factorial of a power": "\\boxed{(10^{10^{10}})!}",
        "code in a box": "\\boxed{" + code + "}",
        "bare code": code,
        "eval in a box": "\\boxed{eval(\"open('" + str(marker) + "', 'w')\")}",
        "a 100k-digit number": "9" * 100_000,
        "a 100k-digit boxed number": "\\boxed{" + "9" * 100_000 + "}",
        "1 MB of text": "x" * (1 << 20) + "\\boxed{1}",
        "20k unclosed boxes": "\\boxed{" * 20_000,
        "200-deep braces": "\\boxed{" + "{" * 200 + "1" + "}" * 200 + "}",
        "a LaTeX macro bomb": "\\def\\a{\\a\\a}\\boxed{\\a}",
        "deeply nested fractions": "\\boxed{" + "\\frac{1}{" * 300 + "1" + "}" * 300 + "}",
        "a huge matrix": "\\boxed{\\begin{pmatrix}" + "&".join(["1"] * 20_000) + "\\end{pmatrix}}",
        "NUL bytes and escapes": "\\boxed{\x00\x1b[2J\u202e2}",
    }
    timeout = 3.0
    with RewardPool(RewardConfig(function="math_verify", workers=2, timeout_s=timeout)) as pool:
        for name, text in hostile.items():
            start = time.monotonic()
            result = pool.score([text], ["271828"])[0]  # an answer none of the texts holds
            seconds = time.monotonic() - start
            ok = result.reward == 0.0 and seconds < timeout + 5 and not marker.exists()
            tally.add("bad_input", f"model output: {name}", ok, f"reward {result.reward}, {result.reason}, {seconds:.2f} s")
        healthy = pool.alive_workers() == 2 and pool.score(["\\boxed{2}"], ["2"])[0].correct
    tally.add("bad_input", "model output: the pool grades honestly afterwards", healthy, "")
    if marker.exists():
        os.unlink(marker)
