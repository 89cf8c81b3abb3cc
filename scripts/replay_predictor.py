#!/usr/bin/env python3
"""Replay a finished run's outcomes through the screen's predictor, for several feature sets.

    python scripts/replay_predictor.py RUN_DIR [--features ngrams,ngrams_1024,arith] [--root DIR] [--out FILE]

RUN_DIR is a training run directory (config.yaml and trace.jsonl, or a kept trace.jsonl.gz); its prompts are made again
from its config (run from the directory the run was started in, or name it with --root, so
relative data paths resolve). The run's own decisions are kept: every pilot, direct and commit
outcome of the trace is fed, step by step, to an online predictor (megatron_pc.allocation.predictor,
with the run's allocation.history settings, or ``--set key=value`` to change them), and each pilot
is scored with the keep chance predicted BEFORE its outcome was seen, exactly as the screen does
online. Printed per feature set: pilots scored, Brier score and AUC of "the pilot lands in the
keep band" (and of "too hard"), beside the same figures under the population prior
(pc_history's prior, which knows nothing of the prompt but its own history).

Feature sets are named in FEATURE_SETS below: ``(records, settings, run config) -> source``; add one
to measure it. Two of them read the run's START model (``model.path``, frozen for the whole replay,
where the online ``policy`` source reads the policy of each step): ``logprob`` (the prompt's token
log-probs: mean, sum, count) and ``start_hidden`` (the final hidden state at the last prompt token,
what the online ``policy`` source gives at step 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from megatron_pc.allocation.config import AllocationConfig, HistoryConfig
from megatron_pc.allocation.feature_sources import FeatureSource, NgramFeatures, prompt_text
from megatron_pc.allocation.history import PromptHistory
from megatron_pc.allocation.predictor import ScreenPredictor, apart, auc, brier
from megatron_pc.config import from_dict, load_config, to_dict
from megatron_pc.data.loading import load_prompts
from megatron_pc.jsonl import open_text


def _arith(records: Sequence[Any], h: HistoryConfig, cfg: Any) -> FeatureSource:
    """Hand-made features of an arithmetic prompt: operand digit counts, the operator, the length."""

    def vector(text: str) -> np.ndarray:
        digits = [len(tok) for tok in "".join(c if c.isdigit() else " " for c in text).split()]
        ops = [text.count(o) for o in "+-*/"]
        d = (digits + [0, 0, 0])[:3]
        return np.array([*d, sum(digits), len(digits), *ops, len(text) / 10.0, max(digits, default=0) * ops[2]], dtype=np.float64)

    texts = [prompt_text(r) for r in records]
    return lambda ids: {p: vector(texts[p]) for p in ids}


class StartModelView:
    """The run's start model, read once per prompt: token log-probs and the last hidden state.

    Prompts are encoded as the run encodes them (``encode_prompt`` with the run's data settings)
    and forwarded one at a time in fp32 through transformers, so no padding enters the figures.
    """

    def __init__(self, records: Sequence[Any], cfg: Any) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from megatron_pc.data.tokenize import encode_prompt

        path = Path(cfg.model.path)
        if not (path / "config.json").is_file():
            raise SystemExit(f"model.path: {path} is not a model directory; run from the run's directory or pass --root")
        self.torch = torch
        self.records, self.cfg = records, cfg
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        self.encode = lambda r: encode_prompt(r, self.tokenizer, cfg.data.max_prompt_tokens, cfg.data.chat_template)
        self.cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def read(self, prompt: int) -> tuple[np.ndarray, np.ndarray]:
        """``(log-probs of tokens 1..n-1, final hidden state at token n-1)`` of one prompt."""
        if prompt not in self.cache:
            torch = self.torch
            ids = torch.tensor([self.encode(self.records[prompt])])
            with torch.no_grad():
                out = self.model(input_ids=ids, output_hidden_states=True)
            logp = torch.log_softmax(out.logits[0, :-1].float(), dim=-1).gather(1, ids[0, 1:, None])[:, 0]
            self.cache[prompt] = (logp.numpy().astype(np.float64), out.hidden_states[-1][0, -1].numpy().astype(np.float64))
        return self.cache[prompt]


def logprob_vector(logp: np.ndarray) -> np.ndarray:
    """The log-prob features of a prompt: mean and sum of its token log-probs, the lowest one and
    the mean of the last eight (the question's end, after any constant template head), and its length."""
    if logp.size == 0:
        return np.zeros(5)
    return np.array([logp.mean(), logp.sum() / 10.0, logp.min(), logp[-8:].mean(), logp.size / 10.0])


def _logprob(records: Sequence[Any], h: HistoryConfig, cfg: Any) -> FeatureSource:
    view = StartModelView(records, cfg)
    return lambda ids: {p: logprob_vector(view.read(p)[0]) for p in ids}


def _start_hidden(records: Sequence[Any], h: HistoryConfig, cfg: Any) -> FeatureSource:
    view = StartModelView(records, cfg)
    return lambda ids: {p: view.read(p)[1] for p in ids}


FEATURE_SETS: dict[str, Callable[[Sequence[Any], HistoryConfig, Any], FeatureSource]] = {
    "ngrams": lambda records, h, cfg: NgramFeatures([prompt_text(r) for r in records], h.ngram_dim, h.ngram_max),
    "ngrams_1024": lambda records, h, cfg: NgramFeatures([prompt_text(r) for r in records], 1024, h.ngram_max),
    "ngrams_4": lambda records, h, cfg: NgramFeatures([prompt_text(r) for r in records], h.ngram_dim, 4),
    "arith": _arith,
    "logprob": _logprob,
    "start_hidden": _start_hidden,
}
"""Feature sets by name: ``(train records, history settings, the run's Config) -> source``."""


def replay(events: list[dict[str, Any]], source: FeatureSource | None, cfg: AllocationConfig) -> dict[str, Any]:
    """Score every pilot of ``events`` by the keep chance the predictor gave it before its outcome."""
    h = cfg.history
    predictor = ScreenPredictor(h) if source is not None else None
    history = PromptHistory(h.half_life)
    rows: list[tuple[float, float, bool, bool, float | None, bool]] = []  # (p_keep, population p_keep, kept, too hard, predicted p, apart)
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["event"] in ("pilot", "direct", "commit") and "successes" in e:
            by_step[e["step"]].append(e)
    for step in sorted(by_step):
        step_events = by_step[step]
        if predictor is not None:
            wanted = sorted({e["prompt"] for e in step_events if not predictor.has_features(e["prompt"])})
            predictor.add_features(source(wanted), step)
        current_round = None
        for e in step_events:
            if e["round"] != current_round:
                if predictor is not None:
                    predictor.flush(step)
                current_round = e["round"]
            prompt, successes, n = e["prompt"], e["successes"], e["n"]
            predicted = None
            if e["event"] != "commit":
                population = history.prior(step)
                predicted = predictor.prediction(prompt, step) if predictor is not None else None
                prior = (predictor.prior(prompt, step) if predicted is not None else None) or population
                if e["event"] == "pilot":
                    post, pop_post = history.posterior(prompt, step, prior), history.posterior(prompt, step, population)
                    p_keep = post.p_keep(cfg.pilot.n, cfg.p_lower, cfg.p_upper)
                    pop_keep = pop_post.p_keep(cfg.pilot.n, cfg.p_lower, cfg.p_upper)
                    p_hat = successes / n
                    rows.append((p_keep, pop_keep, cfg.p_lower <= p_hat <= cfg.p_upper, p_hat < cfg.p_lower, predicted,
                                 apart(post.mean, pop_post.mean, h.screen_relative)
                                 and (predictor is None or predictor.calibrated(prompt, step))))  # fmt: skip
            history.observe(prompt, successes, n, step)
            if predictor is not None:
                predictor.observe(prompt, successes, n, predicted)
        if predictor is not None:
            predictor.flush(step)
    scored = [r for r in rows if r[4] is not None] if predictor is not None else rows
    keep = [r[2] for r in scored]
    hard = [r[3] for r in scored]
    out = {
        "pilots": len(rows),
        "scored": len(scored),
        "brier": brier([r[0] for r in scored], keep),
        "auc": auc([r[0] for r in scored], keep),
        "brier_population": brier([r[1] for r in scored], keep),
        "auc_population": auc([r[1] for r in scored], keep),
        "keep_rate": float(np.mean(keep)) if keep else None,
    }
    # What the screen would have done with these predictions: skip pilots whose keep chance is at
    # most 1 - confidence, when the prediction sets the prompt apart from the pool (exploration aside),
    # and how many of those would have been kept. The population row: the threshold alone.
    screened = [r for r in scored if r[0] <= 1.0 - cfg.history.confidence and (predictor is None or r[5])]
    out["screen_share"] = len(screened) / len(scored) if scored else None
    out["screened_keep_rate"] = float(np.mean([r[2] for r in screened])) if screened else None
    if predictor is not None:
        out["auc_too_hard"] = auc([-r[4] for r in scored], hard)  # a lower predicted rate should mean too hard
        out["strength"] = predictor.strength
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the calibration of each feature set on a finished run's outcomes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--features", default="ngrams,arith", help=f"comma-separated from {', '.join(FEATURE_SETS)}")
    parser.add_argument("--root", type=Path, default=None, help="the directory the run was started in (relative data paths)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an allocation.history setting for the replay")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    run_dir = args.run_dir.resolve()
    names = [n for n in args.features.split(",") if n]
    unknown = [n for n in names if n not in FEATURE_SETS]
    if unknown:
        parser.error(f"--features: unknown {unknown}; choose from {', '.join(FEATURE_SETS)}")
    cfg = load_config(run_dir / "config.yaml")
    history = {**to_dict(cfg.allocation.history), "preset": "screen"}
    for item in args.set:
        key, _, value = item.partition("=")
        history[key] = json.loads(value) if value not in ("ngrams", "policy") else value
    alloc = from_dict(AllocationConfig, {**to_dict(cfg.allocation), "history": history}, "allocation")
    if args.root is not None:
        os.chdir(args.root)
    train, _ = load_prompts(cfg.data, cfg.seed)
    events = []
    with open_text(run_dir / "trace.jsonl") as f:  # or the kept trace.jsonl.gz
        lines = f.read().splitlines()
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a run still writing: its torn last line
    results = {"population prior": replay(events, None, alloc)}
    for name in names:
        results[name] = replay(events, FEATURE_SETS[name](train, alloc.history, cfg), alloc)
    steps = max((e.get("step", 0) for e in events), default=0)
    print(f"{run_dir}: {steps} steps, {results['population prior']['pilots']:,} pilots, keep rate {results['population prior']['keep_rate']:.3f}")
    print("| features | pilots scored | Brier (keep) | AUC (keep) | population Brier | population AUC | AUC (too hard) | "
          "would screen | kept among those | prior a+b |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        cells = [name, f"{r['scored']:,}"] + [f"{r[k]:.4f}" if isinstance(r.get(k), float) else "-" for k in
                                              ("brier", "auc", "brier_population", "auc_population", "auc_too_hard",
                                               "screen_share", "screened_keep_rate", "strength")]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
