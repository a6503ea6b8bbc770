"""TrainerMetrics: family names, labels, verbs, scrape-time readings, the exporter and bench export."""

from __future__ import annotations

import urllib.request

import pytest
import torch
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from trainer.runtime.metrics import (
    CAUSAL_FEATURES_MAX,
    DEFAULT_METRICS_PORT,
    BenchResult,
    GpuMemoryCollector,
    TrainerMetrics,
    build_info,
    export_bench,
    pack_registry,
    push,
    resolve_metrics_port,
    serve,
)
from trainer.runtime.timing import STEP, StepTimer

ENV = {"FOXHUNT_JOB_ID": "job-42", "FOXHUNT_POOL": "h200-a", "FOXHUNT_COMMIT": "abc1234"}


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> TrainerMetrics:
    return TrainerMetrics(registry, plan="eager", info=build_info(plan="eager", device="cpu", environ=ENV))


def test_importing_the_module_registers_nothing_globally() -> None:
    names = {metric.name for metric in REGISTRY.collect()}
    assert not any(name.startswith("foxhunt_") for name in names)


def test_info_carries_the_run_and_the_workflow_environment(
    registry: CollectorRegistry, metrics: TrainerMetrics
) -> None:
    labels = {"job_id": "job-42", "pool": "h200-a", "plan": "eager", "model": "dqn", "commit": "abc1234"}
    assert registry.get_sample_value("foxhunt_train_info", {**labels, "device": "cpu"}) == 1.0
    local = build_info(plan="graph", environ={})
    assert (local["job_id"], local["pool"], local["commit"], local["plan"]) == ("local", "local", "unknown", "graph")
    with pytest.raises(ValueError, match="unknown info keys"):
        TrainerMetrics(CollectorRegistry(), plan="eager", info={"tenant": "x"})


def test_counters_exist_at_zero_before_the_first_step(registry: CollectorRegistry, metrics: TrainerMetrics) -> None:
    for name in ("foxhunt_train_steps_total", "foxhunt_train_epochs_total", "foxhunt_train_guard_skips_total"):
        assert registry.get_sample_value(name, {"plan": "eager"}) == 0.0


def test_step_times_land_in_sub_millisecond_buckets(registry: CollectorRegistry, metrics: TrainerMetrics) -> None:
    metrics.observe_step_times({"adam": [0.00004, 0.0004], STEP: [0.012]})
    bucket = "foxhunt_train_step_seconds_bucket"
    adam = {"plan": "eager", "component": "adam"}
    assert registry.get_sample_value(bucket, {**adam, "le": "5e-05"}) == 1.0
    assert registry.get_sample_value(bucket, {**adam, "le": "0.0003"}) == 1.0
    assert registry.get_sample_value(bucket, {**adam, "le": "0.0005"}) == 2.0
    assert registry.get_sample_value("foxhunt_train_step_seconds_count", adam) == 2.0
    assert registry.get_sample_value("foxhunt_train_step_seconds_sum", adam) == pytest.approx(0.00044)
    step = {"plan": "eager", "component": STEP}
    assert registry.get_sample_value(bucket, {**step, "le": "0.01"}) == 0.0
    assert registry.get_sample_value(bucket, {**step, "le": "0.015"}) == 1.0
    with pytest.raises(ValueError, match="component"):
        metrics.observe_step_times({"Bad-Name": [0.1]})


def test_scrape_drains_an_attached_timer(registry: CollectorRegistry, metrics: TrainerMetrics) -> None:
    timer = StepTimer("cpu")
    metrics.attach_timer(timer)
    for _ in range(3):
        with timer.section("sample"):
            pass
        timer.end_step()
    text = generate_latest(registry).decode()
    assert 'foxhunt_train_step_seconds_count{component="sample",plan="eager"} 3.0' in text
    assert len(timer.drain()["sample"]) == 3  # the loop's own reader still sees every step
    generate_latest(registry)
    assert registry.get_sample_value("foxhunt_train_step_seconds_count", {"plan": "eager", "component": STEP}) == 3


def test_runs_sharing_a_timer_each_observe_every_step_until_detached() -> None:
    """A pack's runs share its step's timer, each through its own reader; a frozen run's metrics stop there."""
    timer = StepTimer("cpu")
    runs = [TrainerMetrics(CollectorRegistry(), plan="eager") for _ in range(2)]
    for i, run in enumerate(runs):
        run.attach_timer(timer, reader=f"metrics-{i}")

    def steps(count: int) -> None:
        for _ in range(count):
            with timer.section("update"):
                pass
            timer.end_step()

    def observed(run: TrainerMetrics) -> float | None:
        labels = {"plan": "eager", "component": "update"}
        return run.registry.get_sample_value("foxhunt_train_step_seconds_count", labels)

    steps(2)
    assert [observed(run) for run in runs] == [2.0, 2.0]
    steps(1)
    runs[1].detach_timer()  # observes the step it had not yet read, then none
    steps(3)
    assert [observed(run) for run in runs] == [6.0, 3.0]


def test_loop_verbs(registry: CollectorRegistry, metrics: TrainerMetrics) -> None:
    metrics.steps_done(2000)
    metrics.epoch_done(12.5)
    metrics.set_losses({"c51": 3.2, "iqn": 0.4})
    metrics.replay(5000, 0.01, 0.5, 2.0)
    metrics.learning_rates({"main": 1e-4, "aux": 3e-4})
    value = registry.get_sample_value
    assert value("foxhunt_train_steps_total", {"plan": "eager"}) == 2000
    assert value("foxhunt_train_epochs_total", {"plan": "eager"}) == 1
    assert value("foxhunt_train_epoch_seconds", {"plan": "eager"}) == 12.5
    assert value("foxhunt_train_loss", {"head": "iqn"}) == pytest.approx(0.4)
    assert value("foxhunt_train_replay_size") == 5000
    assert value("foxhunt_train_replay_priority", {"stat": "max"}) == 2.0
    assert value("foxhunt_train_learning_rate", {"group": "aux"}) == pytest.approx(3e-4)
    with pytest.raises(ValueError, match="unknown loss head"):
        metrics.set_losses({"dqn": 1.0})
    with pytest.raises(ValueError, match="min <= mean <= max"):
        metrics.replay(10, 1.0, 0.5, 2.0)
    with pytest.raises(ValueError, match="learning-rate group"):
        metrics.learning_rates({"critic": 1e-3})
    with pytest.raises(ValueError, match="non-negative"):
        metrics.steps_done(-1)
    with pytest.raises(ValueError, match="non-negative"):
        metrics.epoch_done(-1.0)


def test_a_packs_runs_share_one_registry_under_a_run_label() -> None:
    """Each run of a pack keeps its own families; the pack's registry serves them all, each sample with its run."""
    runs = [CollectorRegistry() for _ in range(3)]
    for i, registry in enumerate(runs):
        metrics = TrainerMetrics(registry, plan="graph", info=build_info(plan="graph", device="cpu", environ=ENV))
        metrics.steps_done(10 * (i + 1))
        metrics.set_losses({"c51": float(i)})
    packed = pack_registry(runs)
    for i in range(3):
        assert packed.get_sample_value("foxhunt_train_steps_total", {"plan": "graph", "run": str(i)}) == 10 * (i + 1)
        assert packed.get_sample_value("foxhunt_train_loss", {"head": "c51", "run": str(i)}) == float(i)
    text = generate_latest(packed).decode()
    assert text.count("# TYPE foxhunt_train_loss gauge") == 1  # one family, three runs' samples
    assert "foxhunt_train_info{" in text and 'run="2"' in text
    with pytest.raises(ValueError, match="1 to 64 runs"):
        pack_registry([CollectorRegistry() for _ in range(65)])


def test_guard_skips_follow_the_device_total(registry: CollectorRegistry, metrics: TrainerMetrics) -> None:
    metrics.guard_skips(3)
    metrics.guard_skips(3)
    metrics.guard_skips(7)
    assert registry.get_sample_value("foxhunt_train_guard_skips_total", {"plan": "eager"}) == 7
    with pytest.raises(ValueError, match="went down"):
        metrics.guard_skips(2)


def test_causal_effects_keep_a_bounded_set_of_the_largest(registry: CollectorRegistry, metrics: TrainerMetrics) -> None:
    metrics.causal([0.1, -0.3, 0.2])
    assert registry.get_sample_value("foxhunt_train_causal_effect", {"feature": "1"}) == pytest.approx(-0.3)
    effects = [0.001 * i for i in range(200)]
    metrics.causal(effects)
    series = [s for m in registry.collect() if m.name == "foxhunt_train_causal_effect" for s in m.samples]
    assert len(series) == CAUSAL_FEATURES_MAX
    assert {s.labels["feature"] for s in series} == {str(i) for i in range(200 - CAUSAL_FEATURES_MAX, 200)}


def test_gpu_memory_on_cpu_exports_nothing(registry: CollectorRegistry, metrics: TrainerMetrics) -> None:
    metrics.gpu_memory(torch.device("cpu"))
    assert "foxhunt_train_gpu_memory_bytes" not in generate_latest(registry).decode()


def test_gpu_memory_collector_describes_its_family_without_reading_the_device() -> None:
    """`describe` is what the registry reads at registration: the family's name and type, no CUDA call."""
    (family,) = GpuMemoryCollector(torch.device("cpu")).describe()
    assert (family.name, family.type, family.samples) == ("foxhunt_train_gpu_memory_bytes", "gauge", [])
    registry = CollectorRegistry()
    registry.register(GpuMemoryCollector(torch.device("cpu")))
    with pytest.raises(ValueError, match="foxhunt_train_gpu_memory_bytes"):  # the name it describes is taken
        registry.register(GpuMemoryCollector(torch.device("cpu")))


@pytest.mark.gpu
def test_gpu_memory_is_read_at_scrape_time(registry: CollectorRegistry, metrics: TrainerMetrics) -> None:
    device = torch.device("cuda")
    metrics.gpu_memory(device)
    metrics.gpu_memory(device)  # idempotent
    before = registry.get_sample_value("foxhunt_train_gpu_memory_bytes", {"kind": "allocated"})
    block = torch.empty(64 << 20, dtype=torch.uint8, device=device)
    after = registry.get_sample_value("foxhunt_train_gpu_memory_bytes", {"kind": "allocated"})
    assert after - before >= 64 << 20
    assert registry.get_sample_value("foxhunt_train_gpu_memory_bytes", {"kind": "peak"}) >= after
    del block


def test_metrics_port_resolution() -> None:
    assert resolve_metrics_port(9500, {"FOXHUNT_METRICS_PORT": "9600"}) == 9500
    assert resolve_metrics_port(None, {"FOXHUNT_METRICS_PORT": "9600"}) == 9600
    assert resolve_metrics_port(None, {"FOXHUNT_METRICS_PORT": ""}) == DEFAULT_METRICS_PORT
    assert resolve_metrics_port(None, {}) is None
    with pytest.raises(ValueError, match="must be a port number"):
        resolve_metrics_port(None, {"FOXHUNT_METRICS_PORT": "metrics"})
    with pytest.raises(ValueError, match=r"0\.\.65535"):
        resolve_metrics_port(None, {"FOXHUNT_METRICS_PORT": "70000"})


def test_serve_exposes_the_registry_over_http(registry: CollectorRegistry, metrics: TrainerMetrics) -> None:
    metrics.steps_done(5)
    exporter = serve(registry, 0, addr="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5) as response:
            body = response.read().decode()
    finally:
        exporter.close()
    assert 'foxhunt_train_steps_total{plan="eager"} 5.0' in body
    assert "foxhunt_train_info{" in body


def test_push_needs_a_job_id(registry: CollectorRegistry) -> None:
    with pytest.raises(ValueError, match="job id"):
        push(registry, "http://127.0.0.1:1", "")


def test_export_bench_gives_each_plan_its_step_time(registry: CollectorRegistry) -> None:
    export_bench(
        registry,
        [BenchResult("eager", "core", 0.016), BenchResult("graph", "core", 0.0042)],
    )
    value = registry.get_sample_value
    eager = value("foxhunt_bench_step_seconds", {"plan": "eager", "config": "core"})
    graph = value("foxhunt_bench_step_seconds", {"plan": "graph", "config": "core"})
    assert eager / graph == pytest.approx(16 / 4.2)
    with pytest.raises(ValueError, match="must be positive"):
        export_bench(CollectorRegistry(), [BenchResult("fused", "core", 0.0)])
