"""Every dashboard query against a real Prometheus scraping real trainers (and the Pushgateway).

The data comes from `python -m trainer train` and `python -m trainer bench` processes on the CPU
(see conftest.py): two scraped trainers, one job's pushed final snapshot, one benchmark's push.

A panel whose query does not parse, or returns nothing, fails. The only queries allowed to be empty
are those of CUDA-only metrics while every exporter runs on the CPU (GPU memory); they must still
parse, and the test checks the exporters really are CPU ones.

`make dashboards-png` plots the panels' data from the same queries into docs/dashboards.png
(tests/k8s/render_dashboards.py, on a stack of its own).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.k8s.conftest import (
    BENCH_CONFIGS,
    BENCH_JOB_ID,
    EPOCH_JOB,
    EPOCH_TIMEOUT,
    FULL_JOB,
    PUSHED_JOB,
    PUSHED_POOL,
    SCRAPED_JOBS,
    SCRAPED_POOL,
    PromStack,
    dashboards,
    prometheus_rule_groups,
)
from tests.polling import wait_until

# Every test here shares one module-scoped stack (Prometheus, a Pushgateway, four trainer processes):
# under pytest-xdist they run on one worker, so it starts once.
pytestmark = pytest.mark.xdist_group("prometheus-stack")

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
    """Each template variable yields values and each panel query returns series, within a deadline.

    The deadline is an epoch's: the epoch-time panel has data once a trainer completes 2000 steps.
    """
    for name, query in variable_queries(dashboard):
        found = LABEL_VALUES.match(query)
        assert found, f"variable {name}: expected label_values(selector, label), got {query}"
        match = substitute(found["match"], variables)
        wait_until(
            lambda m=match, f=found: stack.label_values(f["label"], m), 60, 0.25, what=f"{dashboard['uid']}'s ${name}"
        )

    for title, expr in panel_queries(dashboard):
        query = substitute(expr, variables)
        if any(metric in query for metric in CUDA_ONLY_METRICS):
            assert stack.query(query)["result"] == [], f"{title}: CUDA metrics from a CPU exporter?"
            continue
        result = wait_until(
            lambda q=query: stack.query(q)["result"],
            EPOCH_TIMEOUT,
            0.25,
            what=f"{title!r} of {dashboard['uid']}: {query}",
        )
        assert all(len(series["value"]) == 2 for series in result)


def scraped_variables(job: str = "|".join(SCRAPED_JOBS), plan: str = ".*") -> dict[str, str]:
    return {"pool": SCRAPED_POOL, "job": job, "plan": plan}


def panel_expr(uid: str, title_start: str) -> str:
    """The first query of the panel of dashboard `uid` whose title starts with `title_start`."""
    (board,) = [d for d in dashboards().values() if d["uid"] == uid]
    (expr, *_) = [p["targets"][0]["expr"] for p in board["panels"] if p["title"].startswith(title_start)]
    return str(expr)


def values(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {series["metric"][label]: float(series["value"][1]) for series in result}


def test_the_exporters_are_cpu_ones(prom_stack: PromStack) -> None:
    """The premise of skipping GPU-memory panels: every trainer reports device=cpu."""
    devices = prom_stack.label_values("device", "foxhunt_train_info")
    assert devices == ["cpu"]


def test_a_plan_this_machine_cannot_run_is_labelled_with_the_plan_that_ran(prom_stack: PromStack) -> None:
    """job-epoch asked for `graph`; on a CPU it trains eager, and its series say so."""
    assert "falling back to the eager plan" in prom_stack.trainers[EPOCH_JOB].log.read_text()
    info = prom_stack.query(f'foxhunt_train_info{{job_id="{EPOCH_JOB}"}}')["result"]
    assert [series["metric"]["plan"] for series in info] == ["eager"]
    assert prom_stack.label_values("plan", "foxhunt_train_step_seconds_count") == ["eager"]


def test_every_dashboard_query_returns_data_from_scraped_trainers(prom_stack: PromStack) -> None:
    for dashboard in dashboards().values():
        check_dashboard(prom_stack, dashboard, scraped_variables())
    epochs = prom_stack.query(
        f"foxhunt_train_epochs_total * on (job, instance) group_left (job_id) "
        f'foxhunt_train_info{{job_id="{EPOCH_JOB}"}}'
    )["result"]
    assert values(epochs, "job_id")[EPOCH_JOB] >= 1


def test_every_dashboard_query_returns_data_from_pushed_snapshots(prom_stack: PromStack) -> None:
    """The short job trains one epoch, pushes its final snapshot and exits 0; the dashboards show it."""
    from contracts.config import STEPS_PER_EPOCH

    pushed = prom_stack.trainers[PUSHED_JOB]
    assert pushed.wait_exit(EPOCH_TIMEOUT) == 0, pushed.tail()
    variables = {"pool": PUSHED_POOL, "job": PUSHED_JOB, "plan": ".*"}
    for dashboard in dashboards().values():
        check_dashboard(prom_stack, dashboard, variables)
    selector = f'{{job="foxhunt-trainer", instance="{PUSHED_JOB}"}}'
    assert values(prom_stack.query(f"foxhunt_train_steps_total{selector}")["result"], "plan") == {
        "eager": STEPS_PER_EPOCH
    }
    assert values(prom_stack.query(f"foxhunt_train_epochs_total{selector}")["result"], "plan") == {"eager": 1}
    (epoch_seconds,) = values(prom_stack.query(f"foxhunt_train_epoch_seconds{selector}")["result"], "plan").values()
    step_count = values(
        prom_stack.query(f'foxhunt_train_step_seconds_count{{component="step", instance="{PUSHED_JOB}"}}')["result"],
        "plan",
    )
    step_sum = values(
        prom_stack.query(f'foxhunt_train_step_seconds_sum{{component="step", instance="{PUSHED_JOB}"}}')["result"],
        "plan",
    )
    assert step_count == {"eager": STEPS_PER_EPOCH}  # every step's time reached the final push
    assert step_sum["eager"] <= epoch_seconds  # the epoch's wall time holds its steps (and data collection)


def test_speed_up_over_eager_is_computed_from_the_bench_push(prom_stack: PromStack) -> None:
    """The benchmark panels show the real benchmark's numbers, and the speed-up is eager's time / a plan's."""
    measured = {
        (row["config"], row["method"]): row["ms_median"] / 1e3
        for row in prom_stack.bench["results"]
        if not row["error"]
    }
    assert {config for config, _ in measured} == set(BENCH_CONFIGS)
    pushed = {
        (s["metric"]["config"], s["metric"]["plan"]): float(s["value"][1])
        for s in wait_until(
            lambda: prom_stack.query(f'foxhunt_bench_step_seconds{{instance="{BENCH_JOB_ID}"}}')["result"],
            60,
            0.25,
            what="the benchmark's push",
        )
    }
    assert pushed == pytest.approx(measured)
    speedup = {
        (s["metric"]["config"], s["metric"]["plan"]): float(s["value"][1])
        for s in prom_stack.query(panel_expr("foxhunt-plans", "Benchmark: speed-up"))["result"]
    }
    expected = {(config, plan): pushed[(config, "eager")] / seconds for (config, plan), seconds in pushed.items()}
    assert speedup == pytest.approx(expected)
    assert all(speedup[(config, "eager")] == pytest.approx(1.0) for config in BENCH_CONFIGS)


def test_live_breakdown_adds_up_to_the_step_time(prom_stack: PromStack) -> None:
    """The stacked panel's components sum to the measured step time of the same job (timer gaps aside)."""
    variables = scraped_variables(FULL_JOB, "eager")
    breakdown = substitute(panel_expr("foxhunt-training", "Per-step"), variables)
    step = substitute(panel_expr("foxhunt-training", "Step time"), variables)
    components = prom_stack.query(f"count({breakdown})")["result"]
    assert float(components[0]["value"][1]) >= 10  # every component of the full config is on
    total = float(prom_stack.query(f"sum({breakdown})")["result"][0]["value"][1])
    whole = float(prom_stack.query(step)["result"][0]["value"][1])
    assert 0.7 * whole <= total <= whole * 1.01


def test_recording_rule_labels_each_job_with_its_pool(prom_stack: PromStack) -> None:
    series = wait_until(
        lambda: (
            len(r := prom_stack.query(f'foxhunt:train_step_seconds:mean5m{{pool="{SCRAPED_POOL}"}}')["result"]) == 2
            and r
        ),
        60,
        0.25,
        what="the recording rule to produce both scraped jobs",
    )
    assert {s["metric"]["job_id"] for s in series} == set(SCRAPED_JOBS)


def test_every_rule_evaluates_without_error_on_real_data(prom_stack: PromStack) -> None:
    """Each recording and alerting rule has been evaluated against the trainers' series, and none failed."""
    rules = wait_until(
        lambda: (r := prom_stack.rules()) and all(rule["health"] != "unknown" for rule in r) and r,
        60,
        0.25,
        what="every rule to be evaluated once",
    )
    failed = {rule["name"]: rule.get("lastError") for rule in rules if rule["health"] != "ok"}
    assert not failed
    shipped = {rule.get("alert", rule.get("record")) for group in prometheus_rule_groups() for rule in group["rules"]}
    assert {rule["name"] for rule in rules} == shipped
