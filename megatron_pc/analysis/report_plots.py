"""The report's PNG plots (matplotlib, Agg backend; imported only when a report is drawn).

* ``accuracy_vs_rollouts.png``: validation accuracy against cumulative generated rollouts, one
  panel per task, a line per strategy (the median over seeds, on a common rollout grid) with
  the seeds' range as a band, and the targets as dotted lines; with a budget R, up to R, with
  R/4 .. R marked.
* ``zero_variance.png``: per task, the zero-variance share of the trained groups (top row) and
  the mean group reward variance (bottom row) against the step, median over seeds.
* ``ratios.png``: rollouts (left) and training seconds (right) to each target of every strategy
  over Pilot-Commit's (the median paired ratio, its 90% interval as a whisker), per task: a bar
  above 1 is a task where Pilot-Commit needed less.

:func:`draw_all` returns each file's panel titles; summary.json records them so a test (or a
reader) can check a plot holds what it should.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron_pc.analysis.budget import BUDGET_SHARES
from megatron_pc.analysis.runs import FIELD_STRATEGIES, MAIN_STRATEGIES, REFERENCE, Run

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_COLORS = {
    "pilot_commit": "tab:green", "grpo": "tab:blue", "dapo": "tab:orange",  # the main strategies
    "speed_rl": "tab:olive", "greso": "tab:red", "mopps": "tab:gray",  # the field's allocators
    "pc_history": "tab:purple", "pc_screen": "tab:pink", "pc_meta": "tab:brown",  # PC's variants (dashed)
    "grpo_matched": "tab:cyan", "pc_sized": "black",  # the ablations (dashed)
    "pc_meta_sized": "navy", "pc_meta_coarse": "peru", "pc_meta_noisy": "rosybrown",  # pc_meta's ablations (dashed)
    "pc_screen_sized": "teal", "pc_meta_sized_sp2": "slateblue", "pc_screen_sized_sp2": "darkcyan",
}
"""One colour per label of the benchmark's matrix, so that no two of its lines share one."""
FIELD_ALLOCATORS = FIELD_STRATEGIES
"""The field's allocators: compared strategies, drawn solid like the main ones."""
_CAP = 4.0
"""A ratio bar is drawn this high when only Pilot-Commit reached the target (1 / _CAP when
only the other strategy did)."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError(f"the report's plots need matplotlib, which {sys.prefix} lacks: {sys.executable} -m pip install "
                          "'matplotlib>=3.8' (or re-run bash scripts/install.sh, with --gpu in a GPU environment: both "
                          "sets include it)") from None
    matplotlib.use("Agg")  # files only; never a display
    import matplotlib.pyplot as plt

    return plt


def _color(name: str, i: int) -> str:
    return _COLORS.get(name, f"C{i % 10}")


def _style(name: str) -> str:
    """Solid lines for the compared strategies, dashed for ablations and other labels."""
    return "-" if name in (*MAIN_STRATEGIES, *FIELD_ALLOCATORS) else "--"


def _legend(name: str, mine: list[Run]) -> str:
    """A line's label with its update rule: ``grpo [reference]``."""
    return f"{name} [{','.join(sorted({r.update_rule for r in mine}))}]"


def _by_strategy(runs: list[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(r.strategy, []).append(r)
    return out


def _accuracy_panel(ax: "Axes", runs: list[Run], targets: list[float], budget: float | None = None) -> None:
    import numpy as np

    for i, (name, mine) in enumerate(_by_strategy(runs).items()):
        span = min(r.points[-1].rollouts for r in mine)
        span = min(span, budget) if budget else span  # an equal-budget benchmark compares up to the budget
        grid = np.linspace(0.0, span, 60) if span > 0 else np.zeros(1)
        curves = np.array([np.interp(grid, [p.rollouts for p in r.points], [p.accuracy for p in r.points]) for r in mine])
        color = _color(name, i)
        ax.plot(grid, np.median(curves, axis=0), color=color, linestyle=_style(name), label=f"{_legend(name, mine)} ({len(mine)} seed{'s' * (len(mine) > 1)})")
        if len(mine) > 1:
            ax.fill_between(grid, curves.min(axis=0), curves.max(axis=0), color=color, alpha=0.2, linewidth=0)
    for t in targets:
        ax.axhline(t, color="grey", linestyle=":", linewidth=0.8)
    for share in BUDGET_SHARES if budget else ():
        ax.axvline(share * budget, color="grey", linestyle="--", linewidth=0.6)
    ax.set_xlabel("generated rollouts")
    ax.set_ylabel("validation accuracy")
    ax.legend(fontsize=7)


def _per_step_panel(ax: "Axes", runs: list[Run], key: str, label: str) -> None:
    for i, (name, mine) in enumerate(_by_strategy(runs).items()):
        values: dict[int, list[float]] = {}
        for r in mine:
            for row in r.steps:
                if row.get(key) is not None:
                    values.setdefault(int(row["step"]), []).append(float(row[key]))
        steps = sorted(values)
        ax.plot(steps, [statistics.median(values[s]) for s in steps], color=_color(name, i), linestyle=_style(name), label=_legend(name, mine), linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel(label)
    ax.legend(fontsize=7)


def _ratio_panel(ax: "Axes", summary: dict[str, Any], axis: str) -> None:
    """Bars from 1 to other / Pilot-Commit on a log scale: up where PC needed less, down where more."""
    regimes = list(summary["regimes"])
    seen = {n for reg in summary["regimes"].values() for n in reg["strategies"] if n != REFERENCE}
    others = [n for n in ("grpo", "dapo") if n in seen] + sorted(seen - {"grpo", "dapo"})
    fractions = sorted({f for reg in summary["regimes"].values() for f in reg["fractions"]})
    width = 0.8 / max(len(others) * len(fractions), 1)
    for k, name in enumerate(others):
        for j, frac in enumerate(fractions):
            xs, heights, hatches, whiskers = [], [], [], []
            for x, reg in enumerate(summary["regimes"].values()):
                if frac not in reg["fractions"]:
                    continue
                r = reg["targets"][reg["fractions"].index(frac)]["strategies"].get(name, {}).get("vs_pilot_commit", {}).get(axis)
                if r is None or (r["ratio"] is None and r["status"] not in ("reference_only", "other_only")):
                    continue
                if r["ratio"] is not None:
                    height, hatch = r["ratio"], ""
                else:  # one side never reached the target: a capped bar, hatched
                    height, hatch = (_CAP, "//") if r["status"] == "reference_only" else (1.0 / _CAP, "xx")
                xs.append(x - 0.4 + width * (k * len(fractions) + j + 0.5))
                heights.append(height - 1.0)
                hatches.append(hatch)
                if r["ratio"] is not None and r.get("ci_low") is not None:  # the 90% interval of the paired ratio
                    high = _CAP * 1.2 if r.get("ci_high_unbounded") else r["ci_high"]
                    whiskers.append((xs[-1], r["ratio"], r["ci_low"], high))
            bars = ax.bar(xs, heights, width, bottom=1.0, color=_color(name, k + 1), alpha=0.4 + 0.6 * (j + 1) / len(fractions),
                          label=f"{name}/PC at {100 * frac:.0f}% of the gain")  # fmt: skip
            for bar, hatch in zip(bars, hatches):
                bar.set_hatch(hatch)
            for x, mid, low, high in whiskers:
                ax.errorbar([x], [mid], yerr=[[mid - low], [high - mid]], color="black", linewidth=0.7, capsize=2)
    ax.set_yscale("log", base=2)
    ax.set_ylim(1.0 / (_CAP * 1.2), _CAP * 1.2)
    ticks = [0.25, 0.5, 1.0, 2.0, 4.0]
    ax.set_yticks(ticks, [f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.axhspan(1.0, _CAP * 1.2, color="tab:green", alpha=0.06)
    ax.axhspan(1.0 / (_CAP * 1.2), 1.0, color="tab:red", alpha=0.06)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.text(0.01, 0.98, "Pilot-Commit needed less", transform=ax.transAxes, va="top", fontsize=7, color="darkgreen")
    ax.text(0.01, 0.02, "Pilot-Commit needed more", transform=ax.transAxes, va="bottom", fontsize=7, color="darkred")
    ax.set_xticks(range(len(regimes)), regimes)
    ax.set_ylabel(f"{axis} to target, other / Pilot-Commit")


def draw_all(runs: list[Run], summary: dict[str, Any], out: Path) -> dict[str, list[str]]:
    """Write the three plots into ``out``; returns {file name: panel titles}."""
    plt = _pyplot()
    regimes = list(summary["regimes"])
    titles: dict[str, list[str]] = {}
    cols = len(regimes)

    fig, axes = plt.subplots(1, cols, figsize=(5 * cols, 4), squeeze=False)
    titles["accuracy_vs_rollouts.png"] = []
    for ax, name in zip(axes[0], regimes):
        reg = summary["regimes"][name]
        _accuracy_panel(ax, [r for r in runs if r.regime == name], reg["target_accuracies"], summary.get("budget"))
        title = f"{name}: validation accuracy vs rollouts"
        ax.set_title(title, fontsize=9)
        titles["accuracy_vs_rollouts.png"].append(title)
    _save(plt, fig, out / "accuracy_vs_rollouts.png")

    fig, axes = plt.subplots(2, cols, figsize=(5 * cols, 6.5), squeeze=False)
    titles["zero_variance.png"] = []
    for c, name in enumerate(regimes):
        mine = [r for r in runs if r.regime == name]
        for row, (key, label) in enumerate((("zero_variance_share", "zero-variance share of trained groups"),
                                             ("group_reward_var_mean", "mean group reward variance"))):  # fmt: skip
            _per_step_panel(axes[row][c], mine, key, label)
            title = f"{name}: {label}"
            axes[row][c].set_title(title, fontsize=9)
            titles["zero_variance.png"].append(title)
    _save(plt, fig, out / "zero_variance.png")

    fig, axes = plt.subplots(1, 2, figsize=(max(5, 2.5 * cols) * 2 + 2.5, 4), squeeze=False)
    titles["ratios.png"] = []
    for ax, axis in zip(axes[0], ("rollouts", "seconds")):
        _ratio_panel(ax, summary, axis)
        title = f"{axis} to target, other / Pilot-Commit (//: only PC reached, xx: only the other)"
        ax.set_title(title, fontsize=9)
        titles["ratios.png"].append(title)
    if axes[0][1].get_legend_handles_labels()[0]:
        axes[0][1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    _save(plt, fig, out / "ratios.png")
    return titles


def _save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
