"""The bench's report: its table, its picture and its files (bench.json, bench.png, bench.md), all from the
document `trainer.tools.bench.run_bench` returns (or `trainer.tools.bench_isolated` builds), so a saved bench.json can
be rendered again."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.runtime.timing import COLLECT_COMPONENTS

Row = dict[str, Any]
"""One row of bench.json: a `train`, `pack` or plain bench result."""


def row_label(row: dict[str, Any]) -> str:
    """A result row's method, with its source and round in an A/B document (`trainer.tools.bench_isolated`)."""
    if row.get("round") is None or row.get("source") is None:
        return str(row["method"])
    return f"{row['method']} @{row['source']} #{row['round'] + 1}"


def format_table(document: dict[str, Any]) -> str:
    """The plan's table: plan, ms/step median and spread, epoch seconds, speed-up, peak memory."""
    lines = [
        f"{'preset':<6} {'method':<14} {'ms/step':>9} {'spread (min-max)':>18} {'epoch s':>8} "
        f"{'speed-up':>9} {'peak GiB':>9}"
    ]
    for r in document["results"]:
        method = row_label(r)
        if r["error"]:
            lines.append(f"{r['config']:<6} {method:<14} failed: {r['error']}")
            continue
        speed = f"{r['speedup']:.1f}x" if r["speedup"] else "-"
        mem = f"{r['peak_mem_gib']:.2f}" if r["peak_mem_gib"] is not None else "-"
        spread = f"{r['ms_min']:.3f}-{r['ms_max']:.3f}"
        lines.append(
            f"{r['config']:<6} {method:<14} {r['ms_median']:>9.3f} {spread:>18} {r['epoch_s']:>8.2f} "
            f"{speed:>9} {mem:>9}"
        )
    for row in document["timer_overhead"]:
        lines.append(
            f"timer overhead [{row['config']} {row['method']}]: {row['ms_timer_on']:.3f} ms on, "
            f"{row['ms_timer_off']:.3f} ms off ({row['overhead_pct']:+.2f}%)"
        )
    lines.extend(format_train_rows(document.get("train", [])))
    lines.extend(format_pack_rows(document.get("pack", [])))
    if document.get("ab"):
        from trainer.tools.bench_isolated import format_ab_table

        lines += ["", "A/B (alternating, each run in a fresh process):", format_ab_table(document)]
    return "\n".join(lines)


def format_rows(header: str, rows: list[Row], head: Callable[[Row], str], body: Callable[[Row], str]) -> list[str]:
    """A table of bench rows: `header`, then a line a row, `head` (what it ran) then `body` or its error."""
    if not rows:
        return []
    return [header] + [f"{head(r)} failed: {r['error']}" if r["error"] else f"{head(r)} {body(r)}" for r in rows]


def format_train_rows(rows: list[dict[str, Any]]) -> list[str]:
    """The `train` rows: updates/s of real training and its per-update split into collection and update."""

    def body(r: dict[str, Any]) -> str:
        parts = {name: ms for name, ms in r["breakdown_ms"].items() if name != "step"}
        collect = sum(ms for name, ms in parts.items() if name in COLLECT_COMPONENTS)
        update = sum(ms for name, ms in parts.items() if name not in COLLECT_COMPONENTS)
        ratio = r["ms_per_update"] / update if update > 0 else float("nan")  # the epoch over its updates alone
        return f"{r['updates_per_s']:>10.1f} {r['ms_per_update']:>10.3f} {collect:>10.3f} {update:>10.3f} {ratio:>8.2f}"

    return format_rows(
        f"{'train':<8} {'plan':<9} {'K':>3} {'updates':>7} {'updates/s':>10} {'ms/update':>10} "
        f"{'collect ms':>10} {'update ms':>10} {'x update':>8}",
        rows,
        lambda r: f"{r['recipe']:<8} {r['plan']:<9} {r['steps_per_replay']:>3} {r['updates']:>7}",
        body,
    )


def format_pack_rows(rows: list[dict[str, Any]]) -> list[str]:
    """The `pack` rows: K runs as one pack, its step, updates/s of all runs and the speed-up over one solo run."""

    def body(r: dict[str, Any]) -> str:
        speed = f"{r['aggregate_speedup']:.2f}x" if r["aggregate_speedup"] else "-"
        solo = f"{r['solo_ms']:.3f}" if r["solo_ms"] else "-"
        per_run = f"{r['peak_mem_per_run_gib']:.3f}" if r["peak_mem_per_run_gib"] is not None else "-"
        solo_mem = f"{r['solo_peak_mem_gib']:.3f}" if r["solo_peak_mem_gib"] is not None else "-"
        spread = f"{r['ms_min']:.3f}-{r['ms_max']:.3f}"
        return (
            f"{r['ms_median']:>9.3f} {spread:>18} {r['updates_per_s']:>10.0f} {solo:>8} {speed:>9} "
            f"{per_run:>8} {solo_mem:>8}"
        )

    return format_rows(
        f"{'pack':<6} {'method':<14} {'K':>3} {'ms/step':>9} {'spread (min-max)':>18} {'updates/s':>10} "
        f"{'solo ms':>8} {'aggregate':>9} {'GiB/run':>8} {'solo GiB':>8}",
        rows,
        lambda r: f"{r['config']:<6} {r['method']:<14} {r['pack']:>3}",
        body,
    )


def plot(document: dict[str, Any], path: Path) -> bool:
    """Bar chart of median ms/step per method, one group per preset, min-max as error bars. Returns
    False, drawing nothing, where matplotlib is not installed (it is needed for this picture only)."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in document["results"] if r["ms_median"] is not None]
    presets = list(dict.fromkeys(r["config"] for r in rows))
    methods = list(dict.fromkeys(row_label(r) for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(1, len(presets))
    for i, preset in enumerate(presets):
        xs, ys, lo, hi = [], [], [], []
        for j, method in enumerate(methods):
            match = [r for r in rows if r["config"] == preset and row_label(r) == method]
            if match:
                r = match[0]
                xs.append(j + i * width)
                ys.append(r["ms_median"])
                lo.append(r["ms_median"] - r["ms_min"])
                hi.append(r["ms_max"] - r["ms_median"])
        bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=preset)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks([j + width * (len(presets) - 1) / 2 for j in range(len(methods))], methods)
    ax.set_yscale("log")
    ax.set_ylabel("ms per training step (median, log scale)")
    env = document["environment"]
    ax.set_title(
        f"foxhunt step time: {env.get('gpu', env['device'])}, torch {env['torch']}, batch "
        f"{document['options']['batch_size']}"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _note(line: str) -> None:
    """A progress note on stderr, beside the bench's other progress lines (stdout holds the table)."""
    print(line, file=sys.stderr)


def write_outputs(
    document: dict[str, Any], out_dir: Path, command: str, log: Callable[[str], None] = _note
) -> list[Path]:
    """bench.json, bench.png and bench.md (table, environment, command) under `out_dir`; the paths written
    (without bench.png, and a note to `log`, where matplotlib is not installed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {**document, "command": command}
    json_path, png_path, md_path = out_dir / "bench.json", out_dir / "bench.png", out_dir / "bench.md"
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    plotted = plot(document, png_path)
    if not plotted:
        log(f"no {png_path.name}: matplotlib is not installed (pip install matplotlib to draw it)")
    env = document["environment"]
    md = [
        "# foxhunt step benchmark",
        "",
        f"- device: {env.get('gpu', env['device'])}",
        f"- date: {env['date']}",
        f"- torch {env['torch']}, CUDA {env['cuda']}, Triton {env.get('triton')}, Python {env['python']}",
        f"- command: `{command}`",
        "",
        "```",
        format_table(document),
        "```",
        "",
        "![step time](bench.png)" if plotted else "(no plot: matplotlib was not installed)",
        "",
    ]
    md_path.write_text("\n".join(md))
    return [json_path, png_path, md_path] if plotted else [json_path, md_path]
