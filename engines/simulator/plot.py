"""TTFT p50 against load, one line per policy (dashed with kvstore), one panel per fleet
size. Needs matplotlib (a development dependency); callers check :func:`available`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engines.simulator.sweep import Point


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def ttft_against_load(points: list[Point], path: str | Path) -> None:
    """Write the PNG to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({p.workers for p in points})
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.5 * len(sizes), 3.8), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        here = sorted((p for p in points if p.workers == size), key=lambda p: p.load)
        policies = list(dict.fromkeys(policy for policy, _ in here[0].results))
        for policy, store in here[0].results:
            ax.plot([p.load for p in here], [p.results[(policy, store)]["ttft_p50"] * 1e3
                                             for p in here],
                    marker="o", linestyle="--" if store else "-",
                    color=f"C{policies.index(policy)}",
                    label=f"{policy}{' + kvstore' if store else ''}")
        ax.set_title(f"{size} workers (simulated)")
        ax.set_xlabel("offered load (fraction of capacity)")
        ax.set_ylabel("TTFT p50 (ms)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
