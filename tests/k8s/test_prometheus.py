"""Every dashboard query against a real Prometheus scraping real exporters (and the Pushgateway).

A panel whose query does not parse, or returns nothing, fails. The only queries allowed to be empty
are those of CUDA-only metrics while every exporter runs on the CPU (GPU memory); they must still
parse, and the test checks the exporters really are CPU ones.

Set FOXHUNT_RENDER_DASHBOARDS=docs/dashboards.png to also plot the panels' data from the same queries
(FOXHUNT_RENDER_SECONDS sets how much data to gather first; default 60).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.conftest import (
    BENCH_JOB_ID,
    PUSHED_JOBS,
    PUSHED_POOL,
    PUSHED_STEPS,
    SCRAPED_JOBS,
    SCRAPED_POOL,
    PromStack,
    dashboards,
    wait_for,
)

CUDA_ONLY_METRICS = ("foxhunt_train_gpu_memory_bytes",)
RATE_INTERVAL = "20s"
LABEL_VALUES = re.compile(r"^label_values\((?P<match>.+),\s*(?P<label>\w+)\)$", re.S)


def substitute(expr: str, variables: dict[str, str]) -> str:
    """What Grafana does to a query before sending it: template variables become their values."""
    out = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__interval", "1s")
    for name, value in variables.items():
        out = out.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in out, f"unsubstituted variable in {out}"
    return out


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    queries = [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]
    assert queries, f"{dashboard['uid']} has no panel queries"
    return queries


def variable_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(v["name"], v["query"]) for v in dashboard["templating"]["list"] if v["type"] == "query"]


def check_dashboard(stack: PromStack, dashboard: dict[str, Any], variables: dict[str, str]) -> None:
    """Each template variable yields values and each panel query returns series, within a deadline."""
    for name, query in variable_queries(dashboard):
        found = LABEL_VALUES.match(query)
        assert found, f"variable {name}: expected label_values(selector, label), got {query}"
        match = substitute(found["match"], variables)
        wait_for(f"variable {name} of {dashboard['uid']}", lambda m=match, f=found: stack.label_values(f["label"], m))

    for title, expr in panel_queries(dashboard):
        query = substitute(expr, variables)
        if any(metric in query for metric in CUDA_ONLY_METRICS):
            assert stack.query(query)["result"] == [], f"{title}: CUDA metrics from a CPU exporter?"
            continue
        result = wait_for(f"panel {title!r} of {dashboard['uid']}: {query}", lambda q=query: stack.query(q)["result"])
        assert all(len(series["value"]) == 2 for series in result)


def test_the_exporters_are_cpu_ones(prom_stack: PromStack) -> None:
    """The premise of skipping GPU-memory panels: every trainer reports device=cpu."""
    devices = prom_stack.label_values("device", "foxhunt_train_info")
    assert devices == ["cpu"]


def test_every_dashboard_query_returns_data_from_scraped_trainers(prom_stack: PromStack) -> None:
    variables = {"pool": SCRAPED_POOL, "job": "|".join(SCRAPED_JOBS.values()), "plan": ".*"}
    for dashboard in dashboards().values():
        check_dashboard(prom_stack, dashboard, variables)


def test_every_dashboard_query_returns_data_from_pushed_snapshots(prom_stack: PromStack) -> None:
    variables = {"pool": PUSHED_POOL, "job": "|".join(PUSHED_JOBS.values()), "plan": ".*"}
    for dashboard in dashboards().values():
        check_dashboard(prom_stack, dashboard, variables)
    pushed = prom_stack.query('foxhunt_train_steps_total{job="foxhunt-trainer"}')["result"]
    by_instance = {s["metric"]["instance"]: float(s["value"][1]) for s in pushed}
    assert by_instance[PUSHED_JOBS["eager"]] == by_instance[PUSHED_JOBS["graph"]] == PUSHED_STEPS


def test_speed_up_over_eager_is_computed_from_the_bench_push(prom_stack: PromStack) -> None:
    (plans,) = [d for d in dashboards().values() if d["uid"] == "foxhunt-plans"]
    (expr,) = [t["expr"] for p in plans["panels"] if "Benchmark: speed-up" in p["title"] for t in p["targets"]]
    result = prom_stack.query(expr)["result"]
    speedup = {s["metric"]["plan"]: float(s["value"][1]) for s in result}
    times = {
        s["metric"]["plan"]: float(s["value"][1])
        for s in prom_stack.query(f'foxhunt_bench_step_seconds{{instance="{BENCH_JOB_ID}"}}')["result"]
    }
    assert speedup["eager"] == pytest.approx(1.0)
    assert speedup["graph"] == pytest.approx(times["eager"] / times["graph"])


def test_live_breakdown_adds_up_to_the_step_time(prom_stack: PromStack) -> None:
    """The stacked panel's components sum to the measured step time (timer gaps aside)."""
    (training,) = [d for d in dashboards().values() if d["uid"] == "foxhunt-training"]
    (breakdown,) = [p["targets"][0]["expr"] for p in training["panels"] if p["title"].startswith("Per-step")]
    variables = {"pool": SCRAPED_POOL, "job": SCRAPED_JOBS["eager"], "plan": "eager"}
    components = prom_stack.query(f"sum({substitute(breakdown, variables)})")["result"]
    step = prom_stack.query(
        substitute(
            '1e3 * sum(rate(foxhunt_train_step_seconds_sum{component="step", plan="eager"}[$__rate_interval]))'
            ' / sum(rate(foxhunt_train_step_seconds_count{component="step", plan="eager"}[$__rate_interval]))',
            {},
        )
    )["result"]
    total, whole = float(components[0]["value"][1]), float(step[0]["value"][1])
    assert 0.7 * whole <= total <= whole * 1.01


def test_recording_rule_labels_each_job_with_its_pool(prom_stack: PromStack) -> None:
    series = wait_for(
        "the recording rule to produce both scraped jobs",
        lambda: (
            len(r := prom_stack.query(f'foxhunt:train_step_seconds:mean5m{{pool="{SCRAPED_POOL}"}}')["result"]) == 2
            and r
        ),
    )
    assert {s["metric"]["job_id"] for s in series} == set(SCRAPED_JOBS.values())
    rules = prom_stack.query("ALERTS")  # alerts evaluate without error on real data
    assert "result" in rules


@pytest.mark.skipif(not os.environ.get("FOXHUNT_RENDER_DASHBOARDS"), reason="set FOXHUNT_RENDER_DASHBOARDS=<png>")
def test_render_dashboards_png(prom_stack: PromStack) -> None:
    from tests.k8s.render_dashboards import render

    seconds = float(os.environ.get("FOXHUNT_RENDER_SECONDS", "60"))
    started = time.time()
    wait_for("data to accumulate", lambda: time.time() - started >= seconds, timeout=seconds + 30, every=1)
    variables = {"pool": SCRAPED_POOL, "job": "|".join(SCRAPED_JOBS.values()), "plan": ".*"}
    render(prom_stack, dashboards(), lambda e: substitute(e, variables), Path(os.environ["FOXHUNT_RENDER_DASHBOARDS"]))
