"""PNG charts of coverage results (matplotlib, imported lazily, headless backend)."""

from __future__ import annotations

from pathlib import Path

from edgecap.errors import require
from edgecap.png import save_figure


def _pyplot():
    matplotlib = require("matplotlib", "eval", "coverage charts")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grouped_bars(ax, groups: list[str], series: dict[str, list[float]], ylabel: str):
    import numpy as np

    x = np.arange(len(groups))
    width = 0.8 / max(1, len(series))
    for k, (name, values) in enumerate(series.items()):
        ax.bar(x + (k - (len(series) - 1) / 2) * width, values, width, label=name)
    ax.set_xticks(x, groups, rotation=45 if len(groups) > 6 else 0, ha="right" if len(groups) > 6 else "center")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 100)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize="small")


PLOTS = ("coverage_thresholds.png", "coverage_classes.png")


def plot_coverage(summaries: dict[str, dict], out_dir: str | Path, into: dict[Path, Path] | None = None) -> list[Path]:
    """Write coverage_thresholds.png and coverage_classes.png; return their paths. `into` maps
    each chart's path to where to write it instead (edgecap.io.atomic_files' temporaries, whose
    targets the caller has checked)."""
    def save(fig, path: Path) -> Path:
        if into is None:
            return save_figure(fig, path, dpi=120)
        save_figure(fig, into[path], dpi=120, checked=True)
        return path

    plt = _pyplot()
    out_dir = Path(out_dir)
    labels = list(next(iter(summaries.values()))["thresholds"])
    written = []

    fig, ax = plt.subplots(figsize=(6.5, 4))
    series = {name: [100 * (s["thresholds"][lab]["mean"] or 0.0) for lab in labels]
              for name, s in summaries.items()}
    _grouped_bars(ax, labels, series, "coverage (%)")
    ax.set_title("Object coverage by minimum object area")
    fig.tight_layout()
    written.append(save(fig, out_dir / PLOTS[0]))
    plt.close(fig)

    lowest = labels[0]
    classes = sorted({c for s in summaries.values() for c in s["per_class"].get(lowest, {})})
    if classes:
        fig, ax = plt.subplots(figsize=(max(6.5, 0.35 * len(classes) * max(1, len(summaries))), 4.5))
        series = {name: [100 * s["per_class"][lowest].get(c, {}).get("mean", 0.0) for c in classes]
                  for name, s in summaries.items()}
        _grouped_bars(ax, classes, series, "mean profit (%)")
        ax.set_title(f"Coverage per class (objects {lowest} of the image)")
        fig.tight_layout()
        written.append(save(fig, out_dir / PLOTS[1]))
        plt.close(fig)
    return written
