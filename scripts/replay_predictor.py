#!/usr/bin/env python3
"""Replay a finished run's outcomes through the screen's predictor, for several feature sets.

    python scripts/replay_predictor.py RUN_DIR [--features ngrams,ngrams_1024,arith] [--root DIR] [--out FILE]

RUN_DIR is a training run directory (config.yaml and trace.jsonl); its prompts are made again
from its config (run from the directory the run was started in, or name it with --root, so
relative data paths resolve). The run's own decisions are kept: every pilot, direct and commit
outcome of the trace is fed, step by step, to an online predictor (megatron_pc.allocation.predictor,
with the run's allocation.history settings, or ``--set key=value`` to change them), and each pilot
is scored with the keep chance predicted BEFORE its outcome was seen, exactly as the screen does
online. Printed per feature set: pilots scored, Brier score and AUC of "the pilot lands in the
keep band" (and of "too hard"), beside the same figures under the population prior
(pc_history's prior, which knows nothing of the prompt but its own history).

Feature sets are named in FEATURE_SETS below: ``(records, settings) -> source``; add one to measure it.
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
from megatron_pc.allocation.features import FeatureSource, NgramFeatures, prompt_text
from megatron_pc.allocation.history import PromptHistory
from megatron_pc.allocation.predictor import ScreenPredictor, apart, auc, brier
from megatron_pc.config import from_dict, load_config, to_dict
from megatron_pc.data.loading import load_prompts


def _arith(records: Sequence[Any], h: HistoryConfig) -> FeatureSource:
    """Hand-made features of an arithmetic prompt: operand digit counts, the operator, the length."""

    def vector(text: str) -> np.ndarray:
        digits = [len(tok) for tok in "".join(c if c.isdigit() else " " for c in text).split()]
        ops = [text.count(o) for o in "+-*/"]
        d = (digits + [0, 0, 0])[:3]
        return np.array([*d, sum(digits), len(digits), *ops, len(text) / 10.0, max(digits, default=0) * ops[2]], dtype=np.float64)

    texts = [prompt_text(r) for r in records]
    return lambda ids: {p: vector(texts[p]) for p in ids}


FEATURE_SETS: dict[str, Callable[[Sequence[Any], HistoryConfig], FeatureSource]] = {
    "ngrams": lambda records, h: NgramFeatures([prompt_text(r) for r in records], h.ngram_dim, h.ngram_max),
    "ngrams_1024": lambda records, h: NgramFeatures([prompt_text(r) for r in records], 1024, h.ngram_max),
    "ngrams_4": lambda records, h: NgramFeatures([prompt_text(r) for r in records], h.ngram_dim, 4),
    "arith": _arith,
}
"""Feature sets by name: ``(train records, history settings) -> source``."""


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
    for line in (run_dir / "trace.jsonl").read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a run still writing: its torn last line
    results = {"population prior": replay(events, None, alloc)}
    for name in names:
        results[name] = replay(events, FEATURE_SETS[name](train, alloc.history), alloc)
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
