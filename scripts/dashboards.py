"""The Grafana dashboards, defined with grafana-foundation-sdk's typed builders; `make dashboards` writes their JSON.

Usage: python scripts/dashboards.py [--check]
Writes k8s/components/monitoring/dashboards/<uid>.json (what the Kustomize component ships); with
`--check`, writes nothing and exits 1 if a committed file differs from what this code renders
(tests/k8s/test_dashboards.py checks the same).

Every trainer series is joined to `foxhunt_train_info` on (job, instance) to get its `job_id` and
`pool` labels, so the Pool and Job variables filter every panel; `joined()` writes that join once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, prometheus, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models

from contracts.config import STEPS_PER_EPOCH

OUT = Path(__file__).resolve().parents[1] / "k8s" / "components" / "monitoring" / "dashboards"

DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "[$__rate_interval]"
JOB_FILTER = 'job_id=~"$job", pool=~"$pool"'
"""The training dashboard's selection: the chosen jobs of the chosen pools."""
POOL_FILTER = 'pool=~"$pool"'
"""The plans dashboard's selection: every job of the chosen pools."""
INFO_JOIN = "* on (job, instance) group_left (job_id, pool) foxhunt_train_info"
"""Gives a trainer series its job_id and pool labels (from the trainer's info series)."""
STEP = 'component="step", plan=~"$plan"'
"""The whole-step series of the chosen plans (`component!="step"` are its parts)."""


# ---- PromQL --------------------------------------------------------------------------------------


def rate(metric: str, selector: str) -> str:
    return f"rate({metric}{{{selector}}}{RATE})"


def joined(expr: str, info_filter: str) -> str:
    """`expr` with the job_id and pool labels of its trainer, kept only for the selected jobs."""
    return f"{expr} {INFO_JOIN}{{{info_filter}}}"


def mean_step_seconds(by: str, info_filter: str, step: str = STEP) -> str:
    """Mean whole-step time per `by` group: rate of the histogram's sum over the rate of its count."""
    return (
        f"sum by ({by}) ({joined(rate('foxhunt_train_step_seconds_sum', step), info_filter)})\n"
        f"/ sum by ({by}) ({joined(rate('foxhunt_train_step_seconds_count', step), info_filter)})"
    )


# ---- panels --------------------------------------------------------------------------------------


def query(expr: str, legend: str, ref_id: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().ref_id(ref_id).datasource(DATASOURCE).expr(expr).legend_format(legend).range()


def time_series(
    title: str,
    description: str,
    unit: str,
    targets: list[tuple[str, str]],
    *,
    stacked: bool = False,
    width: int = 12,
    height: int = 8,
    decimals: int | None = None,
) -> timeseries.Panel:
    """A line panel, one query per (expr, legend) in `targets`; `stacked` fills the lines on top of each other."""
    mode = common.StackingMode.NORMAL if stacked else common.StackingMode.NONE
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(height)
        .unit(unit)
        .draw_style(common.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(60 if stacked else 10)
        .stacking(common_builders.StackingConfig().mode(mode).group("A"))
        .legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.RIGHT)
            .calcs(["lastNotNull"])
        )
        .tooltip(
            common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING)
        )
    )
    if decimals is not None:
        panel = panel.decimals(decimals)
    for ref_id, (expr, legend) in zip("ABCDEFGH", targets, strict=False):
        panel = panel.with_target(query(expr, legend, ref_id))
    return panel


def bar_gauge(
    title: str, description: str, unit: str, expr: str, legend: str, decimals: int | None = None
) -> bargauge.Panel:
    """Bars of each series' last value (the benchmark pushes one value per plan and configuration)."""
    panel = (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(12)
        .height(8)
        .unit(unit)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
        .with_target(query(expr, legend, "A"))
    )
    return panel.decimals(decimals) if decimals is not None else panel


# ---- dashboards ----------------------------------------------------------------------------------


def query_variable(name: str, label: str, label_values: str) -> dashboard_builders.QueryVariable:
    """A multi-select of the values of a label, "All" by default (`.*`)."""
    return (
        dashboard_builders.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(f"label_values({label_values})")
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .sort(models.VariableSort.ALPHABETICAL_ASC)
        .current(models.VariableOption(text=["All"], value=["$__all"]))
    )


def base(uid: str, title: str, description: str, tags: list[str]) -> dashboard_builders.Dashboard:
    """What both dashboards share: UTC, read-only, shared crosshair, 30 s refresh, Pool/Job/Plan variables."""
    return (
        dashboard_builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(tags)
        .timezone("utc")
        .readonly()
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .refresh("30s")
        .time("now-1h", "now")
        .with_variable(
            dashboard_builders.DatasourceVariable("datasource")
            .label("Data source")
            .type("prometheus")
            .hide(models.VariableHide.DONT_HIDE)
            .current(models.VariableOption(text="Prometheus", value="prometheus"))
        )
        .with_variable(query_variable("pool", "Pool", "foxhunt_train_info, pool"))
        .with_variable(query_variable("job", "Job", 'foxhunt_train_info{pool=~"$pool"}, job_id'))
        .with_variable(query_variable("plan", "Plan", 'foxhunt_train_info{pool=~"$pool", job_id=~"$job"}, plan'))
        .annotation(
            dashboard_builders.AnnotationQuery()
            .name("Annotations & Alerts")
            .built_in(1)
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
            .datasource(models.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        )
    )


def with_panels(board: dashboard_builders.Dashboard, panels: list[timeseries.Panel | bargauge.Panel]) -> dict[str, Any]:
    """The dashboard with `panels` numbered from 1 in order, as a JSON-ready dict."""
    for panel_id, panel in enumerate(panels, start=1):
        board = board.with_panel(panel.id(panel_id))
    encoded: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return encoded


def training() -> dict[str, Any]:
    def per_job(expr: str) -> str:
        return joined(expr, JOB_FILTER)

    plan = 'plan=~"$plan"'
    step_by_job = mean_step_seconds("job_id, plan", JOB_FILTER)
    parts = per_job(rate("foxhunt_train_step_seconds_sum", f'component!="step", {plan}'))
    steps = per_job(rate("foxhunt_train_step_seconds_count", STEP))
    p99 = per_job(rate("foxhunt_train_step_seconds_bucket", STEP))
    panels: list[timeseries.Panel | bargauge.Panel] = [
        time_series(
            "Per-step breakdown (stacked, ms per step)",
            "Each component's time per step, averaged over steps (a component that runs every 10th step adds a "
            "tenth of its time); the stack adds up to the step time. Measured with CUDA events, read back lazily.",
            "ms",
            [(f"1e3 * sum by (component) ({parts})\n/ scalar(sum({steps}))", "{{component}}")],
            stacked=True,
            width=24,
            height=9,
        ),
        time_series(
            "Step time (mean and p99, ms)",
            "Whole-step time per job.",
            "ms",
            [
                (f"1e3 * ({step_by_job})", "{{job_id}} {{plan}} mean"),
                (f"1e3 * histogram_quantile(0.99, sum by (job_id, plan, le) ({p99}))", "{{job_id}} {{plan}} p99"),
            ],
        ),
        time_series(
            "Throughput (steps/s)",
            "Update steps per second per job.",
            "none",
            [
                (
                    f"sum by (job_id, plan) ({per_job(rate('foxhunt_train_steps_total', plan))})",
                    "{{job_id}} {{plan}}",
                )
            ],
        ),
        time_series(
            "Epoch time (s)",
            f"Wall time of the last completed epoch ({STEPS_PER_EPOCH} steps), and the epoch time the current mean "
            "step time projects.",
            "s",
            [
                (per_job(f"foxhunt_train_epoch_seconds{{{plan}}}"), "{{job_id}} {{plan}} measured"),
                (f"{STEPS_PER_EPOCH} * ({step_by_job})", "{{job_id}} {{plan}} projected"),
            ],
        ),
        time_series(
            "Losses", "Last read-back loss per head.", "none", [(per_job("foxhunt_train_loss"), "{{job_id}} {{head}}")]
        ),
        time_series(
            "Guard trips",
            "Updates skipped by the guard (non-finite loss or gradient) in each interval, and in total.",
            "none",
            [
                (
                    f"sum by (job_id) ({per_job(f'increase(foxhunt_train_guard_skips_total{{{plan}}}{RATE})')})",
                    "{{job_id}} per interval",
                ),
                (
                    f"sum by (job_id) ({per_job(f'foxhunt_train_guard_skips_total{{{plan}}}')})",
                    "{{job_id}} total",
                ),
            ],
        ),
        time_series(
            "Replay size",
            "Transitions held in the replay buffer.",
            "short",
            [(per_job("foxhunt_train_replay_size"), "{{job_id}}")],
        ),
        time_series(
            "Replay priorities",
            "Min, mean and max PER priority.",
            "none",
            [(per_job("foxhunt_train_replay_priority"), "{{job_id}} {{stat}}")],
        ),
        time_series(
            "GPU memory",
            "CUDA caching allocator: allocated, reserved and peak allocated bytes (read at scrape time).",
            "bytes",
            [(per_job("foxhunt_train_gpu_memory_bytes"), "{{job_id}} {{kind}}")],
        ),
        time_series(
            "Learning rate",
            "Adam learning rate per optimiser group.",
            "none",
            [(per_job("foxhunt_train_learning_rate"), "{{job_id}} {{group}}")],
        ),
        time_series(
            "Causal effect per feature (top 10)",
            "Mean |change of Q| when a feature is replaced by a shuffled copy.",
            "none",
            [(f"topk(10, {per_job('foxhunt_train_causal_effect')})", "{{job_id}} feature {{feature}}")],
        ),
    ]
    board = base(
        "foxhunt-training",
        "foxhunt / training",
        "One training job (or several): where each step's time goes, losses, guard, replay, memory.",
        ["foxhunt", "training"],
    )
    return with_panels(board, panels)


def plans() -> dict[str, Any]:
    eager = 'component="step", plan="eager"'
    eager_mean = (
        f"  sum({joined(rate('foxhunt_train_step_seconds_sum', eager), POOL_FILTER)})\n"
        f"  / sum({joined(rate('foxhunt_train_step_seconds_count', eager), POOL_FILTER)})\n"
    )
    by_plan = mean_step_seconds("plan", POOL_FILTER)
    parts = joined(rate("foxhunt_train_step_seconds_sum", 'component!="step"'), POOL_FILTER)
    steps = joined(rate("foxhunt_train_step_seconds_count", 'component="step"'), POOL_FILTER)
    panels: list[timeseries.Panel | bargauge.Panel] = [
        time_series(
            "Mean step time by plan (ms)",
            "Whole-step time of every job in the pool, averaged per execution plan.",
            "ms",
            [(f"1e3 * ({by_plan})", "{{plan}}")],
        ),
        time_series(
            "Speed-up over eager (training jobs in the pool)",
            "Mean eager step time divided by each plan's, over the jobs of the selected pools.",
            "x",
            [(f"scalar(\n{eager_mean})\n/ ({by_plan})", "{{plan}}")],
            decimals=2,
        ),
        time_series(
            "Per-step breakdown by plan (ms per step)",
            "Each plan's components side by side, per step.",
            "ms",
            [
                (
                    f"1e3 * sum by (plan, component) ({parts})\n/ on (plan) group_left sum by (plan) ({steps})",
                    "{{plan}} {{component}}",
                )
            ],
            stacked=True,
            width=24,
            height=9,
        ),
        bar_gauge(
            "Benchmark: step time by plan (ms)",
            "Mean step time each plan reached in the benchmark (pushed by it).",
            "ms",
            "1e3 * foxhunt_bench_step_seconds",
            "{{config}} {{plan}}",
        ),
        bar_gauge(
            "Benchmark: speed-up over eager",
            "Eager's benchmarked step time divided by each plan's, per configuration.",
            "x",
            'foxhunt_bench_step_seconds{plan="eager"}\n/ ignoring (plan) group_right foxhunt_bench_step_seconds',
            "{{config}} {{plan}}",
            decimals=2,
        ),
    ]
    board = base(
        "foxhunt-plans",
        "foxhunt / plans",
        "Execution plans side by side: step time and speed-up over eager, live and benchmarked.",
        ["foxhunt", "benchmark"],
    )
    return with_panels(board, panels)


def render() -> dict[str, str]:
    """File name -> the JSON text `make dashboards` writes for it."""
    return {f"{board['uid']}.json": json.dumps(board, indent=2) + "\n" for board in (training(), plans())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a committed file is stale")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = OUT / name
        if path.exists() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(stale)} (run `make dashboards`)", file=sys.stderr)
        return 1
    print(f"wrote: {', '.join(stale)}" if stale and not args.check else "up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
