"""Plot each dashboard panel's data from the panel's own queries, so docs/ shows what Grafana shows.

`make dashboards-png` runs it: `python -m tests.k8s.render_dashboards docs/dashboards.png --seconds 90`
starts the same Prometheus stack the tests use (tests/k8s/conftest.py), lets it gather data for that
many seconds, plots every panel and stops the stack.
"""

from __future__ import annotations

import argparse
import math
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tests.k8s.conftest import ROOT, PromStack, dashboards, install_prometheus, running_stack

SCALE = {"bytes": (1 / 2**20, "MiB"), "ms": (1.0, "ms"), "s": (1.0, "s"), "x": (1.0, "x")}


def _legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), fmt).strip() or "value"


def render(
    stack: PromStack,
    dashboards: dict[str, dict[str, Any]],
    substitute: Callable[[str], str],
    out: Path,
    seconds: float = 300.0,
) -> None:
    """One subplot per panel with data; stacked panels stacked, bar gauges as bars of the last value."""
    panels = [(d["title"], p) for d in dashboards.values() for p in d["panels"]]
    end = time.time()
    start = end - seconds
    drawn: list[tuple[str, dict[str, Any], list[tuple[str, list[float], list[float]]]]] = []
    for board, panel in panels:
        series = []
        for target in panel["targets"]:
            data = stack.query_range(substitute(target["expr"]), start, end, 2.0)
            for result in data["result"]:
                xs = [float(t) - end for t, _ in result["values"]]
                ys = [float(v) for _, v in result["values"]]
                if any(math.isfinite(y) for y in ys):
                    series.append((_legend(target.get("legendFormat", ""), result["metric"]), xs, ys))
        if series:
            drawn.append((board, panel, series))
    cols = 3
    rows = math.ceil(len(drawn) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.4 * rows), squeeze=False)
    for ax, (board, panel, series) in zip(axes.flat, drawn, strict=False):
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        factor, label = SCALE.get(unit, (1.0, ""))
        ax.set_title(f"{panel['title']}\n({board})", fontsize=9)
        if panel["type"] == "bargauge":
            names = [name for name, _, _ in series]
            ax.barh(names, [ys[-1] * factor for _, _, ys in series])
            ax.set_xlabel(label)
        elif panel["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode") == "normal":
            xs = series[0][1]
            same = [s for s in series if len(s[1]) == len(xs)]
            ax.stackplot(xs, *[[y * factor for y in ys] for _, _, ys in same], labels=[n for n, _, _ in same])
        else:
            for name, xs, ys in series:
                ax.plot(xs, [y * factor for y in ys], label=name, linewidth=1)
        if panel["type"] != "bargauge":
            ax.set_xlabel("seconds before now")
            ax.set_ylabel(label)
            ax.legend(fontsize=6, loc="upper left", ncol=2)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(drawn) :]:
        ax.axis("off")
    title = "foxhunt dashboards: panel queries against a real Prometheus scraping `python -m trainer` (tiny, CPU)"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=ROOT / "docs" / "dashboards.png", help="the PNG to write")
    parser.add_argument("--seconds", type=float, default=90.0, help="how long to gather data before plotting")
    args = parser.parse_args(argv)
    from tests.k8s.test_prometheus import scraped_variables, substitute

    with (
        tempfile.TemporaryDirectory(prefix="foxhunt-dashboards-") as workdir,
        running_stack(install_prometheus(), Path(workdir)) as stack,
    ):
        time.sleep(args.seconds)  # the plot shows this much history of the running trainers
        render(stack, dashboards(), lambda expr: substitute(expr, scraped_variables()), args.out, args.seconds)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
