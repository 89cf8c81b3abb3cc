"""report.md from a report summary (:func:`megatron_pc.analysis.report.summarize`)."""

from __future__ import annotations

from typing import Any

from megatron_pc.analysis.budget import interval_text
from megatron_pc.analysis.runs import REFERENCE, VARIANT_REFERENCES


def _num(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _ratio_cell(r: dict[str, Any]) -> str:
    """``1.42x [1.10-1.80]`` (the median paired ratio and its 90% interval), ``tie`` when the
    interval contains 1, or who alone reached the target in most seeds."""
    tie = " tie" if r.get("verdict") == "tie" else ""
    if r["status"] == "both" and r["ratio"] is not None:
        interval = interval_text(r)
        return f"**{r['ratio']:.2f}x** {interval}{tie}".rstrip()
    text = {"reference_only": "only PC reached", "other_only": "PC did not reach", "neither": "neither reached"}.get(r["status"], "-")
    return f"{text}{tie}"


def _reach_cell(s: dict[str, Any], fmt: str) -> str:
    if s["median"] is None:
        return f"not reached ({s['reached']}/{s['runs']})"
    span = f" [{fmt.format(s['min'])}-{fmt.format(s['max'])}]" if s["runs"] > 1 else ""
    return f"{fmt.format(s['median'])}{span} ({s['reached']}/{s['runs']})"


def verdict(regime: dict[str, Any]) -> str:
    """One line: against each strategy, at how many targets Pilot-Commit needs fewer rollouts,
    more, or ties (the 90% interval of the paired ratio contains 1)."""
    parts = []
    for name in [n for n in regime["strategies"] if n != REFERENCE]:
        counts = {"other_more": 0, "other_less": 0, "tie": 0}
        ratios = []
        for t in regime["targets"]:
            r = t["strategies"].get(name, {}).get("vs_pilot_commit", {}).get("rollouts")
            if r is None or r.get("verdict") is None:
                continue
            counts[r["verdict"]] += 1
            if r["ratio"] is not None:
                ratios.append(r["ratio"])
        if sum(counts.values()):
            span = f" ({min(ratios):.2f}x-{max(ratios):.2f}x)" if ratios else ""
            parts.append(f"vs {name}: PC needs fewer rollouts at {counts['other_more']}/{len(regime['targets'])} targets, "
                         f"more at {counts['other_less']}, tie at {counts['tie']}{span}")  # fmt: skip
    return "; ".join(parts) or "no comparison (no targets, or Pilot-Commit not among the runs)"


def accuracy_cell(row: dict[str, Any]) -> str:
    """An accuracy-at-budget row (``at_budget`` in summary.json): ``0.313 [0.305-0.317]``, the
    median over seeds and the seed band, or ``short of it`` when a seed stopped before that spend."""
    return f"{row['median']:.3f} [{row['min']:.3f}-{row['max']:.3f}]" if row["median"] is not None else "short of it"


def _budget_lines(reg: dict[str, Any], budget: float) -> list[str]:
    """Accuracy at R/4 .. R (median over seeds [seed band]) and the validation's precision."""
    rows = reg["at_budget"]
    shares = [row["share"] for row in next(iter(rows.values()))]
    head = ["strategy"] + [f"{s:g} R = {s * budget:,.0f}" for s in shares]
    lines = [f"Validation accuracy at fixed spends (budget R = {budget:,.0f} rollouts; median over seeds [seed band]):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    for name, cells in rows.items():
        lines.append("| " + " | ".join([name, *map(accuracy_cell, cells)]) + " |")
    p = reg["validation_precision"]
    if p["stderr"] is not None and p["smallest_gap"] is not None:
        needed = f"about {p['prompts_needed']:,} validation prompts would" if p["prompts_needed"] else "a larger validation set would"
        state = "holds" if p["ok"] else f"does NOT hold: {needed}"
        lines += ["", f"Validation precision: standard error of one validation {p['stderr']:.4f}; smallest gap between targets "
                      f"(start included) {p['smallest_gap']:.4f}; the rule stderr < gap / 3 {state}."]  # fmt: skip
    return lines


def _overview(summary: dict[str, Any]) -> list[str]:
    lines = ["| task | z (GRPO, step 1) | start accuracy | targets | verdict |", "|---|---|---|---|---|"]
    for name, reg in summary["regimes"].items():
        grpo = reg["strategies"].get("grpo", {})
        targets = ", ".join(f"{t:.3f}" for t in reg["target_accuracies"]) or "none"
        lines.append(f"| {name} | {_num(grpo.get('zero_variance_share_first_step'), '{:.2f}')} | {reg['start_accuracy']:.3f} | {targets} | {verdict(reg)} |")
    return lines


def shown(name: str, figures: dict[str, Any]) -> str:
    """A label with its update rule, as tables and legends show it: ``grpo [reference]``."""
    rule = figures.get("update_rule")
    return f"{name} [{rule}]" if rule else name


def _reach_table(reg: dict[str, Any], axis: str, fmt: str) -> list[str]:
    names = list(reg["strategies"])
    others = [n for n in names if n != REFERENCE]
    head = ["target"] + [shown(n, reg["strategies"][n]) for n in names] + [f"{n}/PC" for n in others if REFERENCE in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for frac, t in zip(reg["fractions"], reg["targets"]):
        cells = [f"{t['accuracy']:.3f} ({100 * frac:.0f}%)"]
        cells += [_reach_cell(t["strategies"][n][axis], fmt) for n in names]
        if REFERENCE in names:
            cells += [_ratio_cell(t["strategies"][n]["vs_pilot_commit"][axis]) for n in others]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


_ALLOCATION_COLUMNS = (
    ("zero_variance_share_first_step", "zero-var share, step 1", "{:.2f}"),
    ("zero_variance_share", "zero-var share (trained)", "{:.2f}"),
    ("group_reward_var_mean", "group reward var", "{:.3f}"),
    ("rollouts_per_step", "rollouts/step", "{:,.0f}"),
    ("updates_per_step", "updates/step", "{:.2f}"),
    ("trained_share", "trained share", "{:.2f}"),
    ("pilot_share", "pilot share", "{:.2f}"),
    ("pilot_keep_rate", "pilot keep rate", "{:.2f}"),
    ("prompts_evicted", "evicted", "{:,.0f}"),
    ("prompts_screened", "screened", "{:,.0f}"),
    ("direct_share", "direct share", "{:.2f}"),
    ("screen_auc", "screen AUC (keep)", "{:.3f}"),
    ("screen_brier", "screen Brier", "{:.3f}"),
    ("screen_brier_population", "population Brier", "{:.3f}"),
    ("bucket_coverage", "bucket coverage", "{:.2f}"),
    ("buffer_age_evictions", "buffer age-outs", "{:,.0f}"),
    ("partial_steps", "partial steps", "{:,.0f}"),
    ("step_seconds", "s/step", "{:.2f}"),
    ("validation_seconds", "s/validation", "{:.1f}"),
    ("start_accuracy", "start acc", "{:.3f}"),
    ("final_accuracy", "final acc", "{:.3f}"),
    ("val_stderr", "val stderr", "{:.4f}"),
)


def _variant_table(reg: dict[str, Any], variant: str) -> list[str]:
    """Every other strategy's rollouts over those of one Pilot-Commit variant, per target."""
    others = [n for n in reg["strategies"] if n != variant]
    head = ["target"] + [f"{n}/{variant}" for n in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for frac, t in zip(reg["fractions"], reg["targets"]):
        cells = [f"{t['accuracy']:.3f} ({100 * frac:.0f}%)"]
        cells += [_ratio_cell(t["strategies"][n][f"vs_{variant}"]["rollouts"]).replace("PC", variant) for n in others]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _allocation_table(reg: dict[str, Any]) -> list[str]:
    head = ["strategy", "update rule", "variant", "seeds"] + [label for _, label, _ in _ALLOCATION_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, f in reg["strategies"].items():
        cells = [name, f.get("update_rule") or "-", f.get("variant") or "-", str(f["seeds"])]
        lines.append("| " + " | ".join(cells + [_num(f.get(k), fmt) for k, _, fmt in _ALLOCATION_COLUMNS]) + " |")
    return lines


def markdown(summary: dict[str, Any], sections: list[str]) -> str:
    """The whole report."""
    budget = summary.get("budget")
    design = (f"Every strategy generated the same budget of {budget:,.0f} rollouts; targets: {summary.get('target_rule')}." if budget
              else f"Runs matched in steps, not in rollouts (the older design); targets: {summary.get('target_rule')}.")  # fmt: skip
    lines = ["# Rollouts to a target accuracy", "",
             "Medians over seeds with [min-max] and (seeds reached / seeds). Ratios (other strategy / Pilot-Commit, above 1: "
             f"Pilot-Commit needed less): {summary.get('statistic', 'median of paired per-seed ratios')}. {design} "
             "Conventions: docs/benchmarks.md.", ""]  # fmt: skip
    lines += _overview(summary)
    for name, reg in summary["regimes"].items():
        gains = ", ".join(f"{n} {g:+.3f}" for n, g in reg["final_gain"].items())
        lines += ["", f"## {name}", "", f"Start accuracy {reg['start_accuracy']:.3f}; final gains {gains}."]
        if reg["strategies_without_gain"]:
            lines.append(f"No gain (targets set by the others): {', '.join(reg['strategies_without_gain'])}.")
        if budget and reg.get("at_budget"):
            lines += [""] + _budget_lines(reg, budget)
        if not reg["targets"]:
            lines += ["", "No strategy improved on the start accuracy: no targets."]
        else:
            lines += ["", "Rollouts generated to reach each target:", ""] + _reach_table(reg, "rollouts", "{:,.0f}")
            lines += ["", "Training seconds (validation excluded) to reach each target:", ""] + _reach_table(reg, "seconds", "{:,.0f}")
            for variant, what in VARIANT_REFERENCES.items():
                if variant in reg["strategies"]:
                    lines += ["", f"Rollouts against {what} ({variant}; above 1 it needed less):", ""] + _variant_table(reg, variant)
        lines += ["", "Allocation (means over seeds and steps; counts at the end of the run):", ""] + _allocation_table(reg)
    plots = summary.get("plots", {})
    if plots:
        lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in plots]
    for block in sections:
        lines += ["", block.rstrip()]
    return "\n".join(lines) + "\n"
