"""Every Prometheus metric family of the trainer, declared once, with verb helpers for the loop.

Nothing is registered at import: `TrainerMetrics(registry, ...)` builds the families into the
registry it is given (tests pass a fresh `CollectorRegistry`). Labels are bounded (plan, component,
head, stat, kind, group, feature index; `run`, a pack's run index, at most 64); the job id appears only on
`foxhunt_train_info`, which the dashboards join on `(job, instance)`. Costly readings happen at scrape time
in Collectors: GPU memory, and the step timer's CUDA events (`attach_timer`), so the training step never
waits for a scrape.

The HTTP exporter (`serve`) is for running pods; `push` sends a final snapshot to a Pushgateway
for short jobs; `export_bench` exports each plan's benchmarked step time so the speed-up over
`eager` is a PromQL division.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, push_to_gateway
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from contracts.plans import plan_names

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from trainer.runtime.timing import StepTimer

DEFAULT_METRICS_PORT = 9400
"""Port of `/metrics` in a pod when FOXHUNT_METRICS_PORT is set without a value (the PodMonitor's port)."""

PUSH_JOB = "foxhunt-trainer"
"""`job` label of pushed snapshots; the same name the PodMonitor gives scraped trainers."""

STEP_BUCKETS: tuple[float, ...] = (
    20e-6, 50e-6, 100e-6, 200e-6, 300e-6, 500e-6, 750e-6,
    1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3, 5e-3, 7.5e-3,
    10e-3, 15e-3, 20e-3, 30e-3, 50e-3, 75e-3,
    0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
"""Seconds: components take 0.02-5 ms, whole steps 1-300 ms; the client's defaults (5 ms-10 s) would
put every component in the first bucket."""

LOSS_HEADS: tuple[str, ...] = ("c51", "cql", "iqn", "iql", "attention", "ensemble", "vaccine")
PRIORITY_STATS: tuple[str, ...] = ("min", "mean", "max")
GPU_MEMORY_KINDS: tuple[str, ...] = ("allocated", "reserved", "peak")
LR_GROUPS: tuple[str, ...] = ("main", "aux")
CAUSAL_FEATURES_MAX = 64
"""At most this many `feature` series: with more features, the largest |effect| ones are kept."""

METRICS_READER = "metrics"
"""The StepTimer reader the scrape-time collector drains (the loop's own drains take nothing from it)."""

INFO_KEYS: tuple[str, ...] = ("job_id", "pool", "plan", "model", "commit", "device")
_COMPONENT = re.compile(r"[a-z][a-z0-9_]*")  # fullmatch: `$` would pass "a\n"


def build_info(
    *, plan: str, model: str = "dqn", device: str = "cpu", environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The `foxhunt_train_info` labels; job id, pool and commit come from the workflow's environment."""
    env = os.environ if environ is None else environ
    return {
        "job_id": env.get("FOXHUNT_JOB_ID") or "local",
        "pool": env.get("FOXHUNT_POOL") or "local",
        "plan": plan,
        "model": model,
        "commit": env.get("FOXHUNT_COMMIT") or "unknown",
        "device": device,
    }


class GpuMemoryCollector(Collector):
    """`foxhunt_train_gpu_memory_bytes{kind}` read from the CUDA caching allocator at scrape time."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def describe(self) -> list[Metric]:
        return [self._family()]

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "foxhunt_train_gpu_memory_bytes",
            "CUDA memory of the trainer's device by kind: allocated, reserved (cached), peak (allocated).",
            labels=["kind"],
        )

    def collect(self) -> Iterator[Metric]:
        import torch

        family = self._family()
        family.add_metric(["allocated"], float(torch.cuda.memory_allocated(self.device)))
        family.add_metric(["reserved"], float(torch.cuda.memory_reserved(self.device)))
        family.add_metric(["peak"], float(torch.cuda.max_memory_allocated(self.device)))
        yield family


class TrainerMetrics:
    """The trainer's metric families in one registry, with one verb per thing the loop reports."""

    def __init__(self, registry: CollectorRegistry, *, plan: str, info: Mapping[str, str] | None = None) -> None:
        self.registry = registry
        self.plan = plan
        labels = dict(info) if info is not None else build_info(plan=plan)
        unknown = set(labels) - set(INFO_KEYS)
        if unknown:
            raise ValueError(f"unknown info keys {sorted(unknown)}; allowed: {', '.join(INFO_KEYS)}")
        labels["plan"] = plan
        self._info_labels = labels
        self._timer: StepTimer | None = None
        self._reader = METRICS_READER
        self._gpu_memory = False
        # The histogram is exposed through _StepSeconds so a timer can be drained just before it is read.
        self.step_seconds = Histogram(
            "foxhunt_train_step_seconds",
            f"Time of one step's component. plan: {plan_names('|')}; component: act, env, "
            "store (collection, online training; collect_graph when it replays as one CUDA graph), sample, "
            "spectral, forward_backward, clip_prune, adam, ema, "
            "attention, iql, iqn, causal, guard, priority (eager), graph, aux_stream (graphed plans), step "
            "(the whole step: one plan call of run.steps_per_replay updates on graphed plans, collection included).",
            ["plan", "component"],
            buckets=STEP_BUCKETS,
            registry=None,
        )
        registry.register(_StepSeconds(self))
        self.steps_total = Counter(
            "foxhunt_train_steps",
            "Update steps completed. plan: the execution plan.",
            ["plan"],
            registry=registry,
        )
        self.epochs_total = Counter(
            "foxhunt_train_epochs", "Epochs (2000 steps) completed. plan: the execution plan.", ["plan"],
            registry=registry,
        )  # fmt: skip
        self.epoch_seconds = Gauge(
            "foxhunt_train_epoch_seconds", "Wall time of the last completed epoch. plan: the execution plan.",
            ["plan"], registry=registry,
        )  # fmt: skip
        self.loss = Gauge(
            "foxhunt_train_loss",
            "Last read-back loss per head. head: c51, cql, iqn, iql, attention, ensemble, vaccine.",
            ["head"],
            registry=registry,
        )
        self.guard_skips_total = Counter(
            "foxhunt_train_guard_skips",
            "Updates skipped by the guard (non-finite loss or gradient). plan: the execution plan.",
            ["plan"],
            registry=registry,
        )
        self.replay_size = Gauge(
            "foxhunt_train_replay_size", "Transitions held in the replay buffer.", registry=registry
        )
        self.replay_priority = Gauge(
            "foxhunt_train_replay_priority",
            "Statistics of the replay's PER priorities. stat: min, mean, max.",
            ["stat"],
            registry=registry,
        )
        self.causal_effect = Gauge(
            "foxhunt_train_causal_effect",
            "Mean |change of Q| when one input feature is replaced by a shuffled copy. feature: index "
            f"(at most {CAUSAL_FEATURES_MAX} series, the largest effects).",
            ["feature"],
            registry=registry,
        )
        self.learning_rate = Gauge(
            "foxhunt_train_learning_rate",
            "Adam learning rate. group: main, aux.",
            ["group"],
            registry=registry,
        )
        self.info = Info("foxhunt_train", "The run: job_id, pool, plan, model, commit, device.", registry=registry)
        self.info.info(labels)
        # Known label values exist at zero from the start (rates and alerts see them before the first step).
        self.steps_total.labels(plan)
        self.epochs_total.labels(plan)
        self.guard_skips_total.labels(plan)
        self._guard_seen = 0

    def attach_timer(self, timer: StepTimer, reader: str = METRICS_READER) -> None:
        """Read `timer` at scrape time (non-blocking), so step times reach Prometheus without a sync. `reader`: this
        registry's queue of the timer, where several read one timer (a pack's runs share their step's)."""
        timer.add_reader(reader)
        self._timer, self._reader = timer, reader

    def detach_timer(self) -> None:
        """Observe what the timer has read back so far, then no more of its steps (a frozen packed run's)."""
        self.drain_timer()
        self._timer = None

    def drain_timer(self) -> None:
        if self._timer is not None:
            self.observe_step_times(self._timer.drain(reader=self._reader))

    def observe_step_times(self, drained: Mapping[str, list[float]]) -> None:
        """Observe each step's seconds per component, as returned by `StepTimer.drain()`."""
        for component, values in drained.items():
            if not _COMPONENT.fullmatch(component):
                raise ValueError(f"component {component!r} must match [a-z][a-z0-9_]*")
            child = self.step_seconds.labels(self.plan, component)
            for seconds in values:
                child.observe(seconds)

    def steps_done(self, n: int = 1) -> None:
        """Count `n` more completed update steps."""
        if n < 0:
            raise ValueError(f"steps_done takes a non-negative count, got {n}")
        self.steps_total.labels(self.plan).inc(n)

    def epoch_done(self, seconds: float) -> None:
        """Count a completed epoch and record its wall time."""
        if seconds < 0:
            raise ValueError(f"epoch seconds must be non-negative, got {seconds}")
        self.epochs_total.labels(self.plan).inc()
        self.epoch_seconds.labels(self.plan).set(seconds)

    def set_losses(self, losses: Mapping[str, float]) -> None:
        """Set the last read-back loss of each head named in `losses`."""
        for head, value in losses.items():
            if head not in LOSS_HEADS:
                raise ValueError(f"unknown loss head {head!r}; expected one of {', '.join(LOSS_HEADS)}")
            self.loss.labels(head).set(float(value))

    def guard_skips(self, total: int) -> None:
        """Bring the skip counter up to the device's running `total` of skipped updates."""
        if total < self._guard_seen:
            raise ValueError(f"guard skip total went down from {self._guard_seen} to {total}")
        self.guard_skips_total.labels(self.plan).inc(total - self._guard_seen)
        self._guard_seen = total

    def replay(self, size: int, pmin: float, pmean: float, pmax: float) -> None:
        """Replay fill and the min/mean/max of its priorities."""
        if not pmin <= pmean <= pmax:
            raise ValueError(f"priority stats must satisfy min <= mean <= max, got {pmin}, {pmean}, {pmax}")
        self.replay_size.set(size)
        for stat, value in zip(PRIORITY_STATS, (pmin, pmean, pmax), strict=True):
            self.replay_priority.labels(stat).set(value)

    def causal(self, effects: Iterable[float]) -> None:
        """Each feature's causal effect; with more than CAUSAL_FEATURES_MAX, keep the largest |effect|."""
        values = [float(v) for v in effects]
        keep = sorted(range(len(values)), key=lambda i: -abs(values[i]))[:CAUSAL_FEATURES_MAX]
        self.causal_effect.clear()
        for index in sorted(keep):
            self.causal_effect.labels(str(index)).set(values[index])

    def gpu_memory(self, device: Any) -> None:
        """Export the CUDA memory of `device`, read at scrape time; a CPU device has none to export."""
        if str(device).startswith("cuda") and not self._gpu_memory:
            self.registry.register(GpuMemoryCollector(device))
            self._gpu_memory = True

    def learning_rates(self, rates: Mapping[str, float]) -> None:
        """Current learning rate per optimiser group (main, aux)."""
        for group, value in rates.items():
            if group not in LR_GROUPS:
                raise ValueError(f"unknown learning-rate group {group!r}; expected one of {', '.join(LR_GROUPS)}")
            self.learning_rate.labels(group).set(float(value))

    @property
    def info_labels(self) -> dict[str, str]:
        return dict(self._info_labels)


class _StepSeconds(Collector):
    """Exposes the step histogram, draining an attached timer first."""

    def __init__(self, metrics: TrainerMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return list(self.metrics.step_seconds.describe())

    def collect(self) -> Iterator[Metric]:
        self.metrics.drain_timer()
        yield from self.metrics.step_seconds.collect()


RUNS_MAX = 64
"""At most this many `run` series per family: the runs of one pack (`contracts.packs.MAX_PACK`)."""


class RunLabelled(Collector):
    """The runs of a pack on one `/metrics`: each run's own registry (`TrainerMetrics`), every sample with a `run`
    label, the run's index in its pack (bounded: at most `RUNS_MAX` runs). Read at scrape time, as each run's
    own collectors are."""

    def __init__(self, registries: Sequence[CollectorRegistry]) -> None:
        if not 1 <= len(registries) <= RUNS_MAX:
            raise ValueError(f"a pack's metrics label 1 to {RUNS_MAX} runs, got {len(registries)}")
        self.registries = list(registries)

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for run, registry in enumerate(self.registries):
            for metric in registry.collect():
                into = merged.setdefault(
                    metric.name, Metric(metric.name, metric.documentation, metric.type, metric.unit)
                )
                into.samples += [
                    sample._replace(labels={**sample.labels, "run": str(run)}) for sample in metric.samples
                ]
        yield from merged.values()


def pack_registry(registries: Sequence[CollectorRegistry]) -> CollectorRegistry:
    """A registry that serves (`serve`) or pushes (`push`) every run of a pack under its `run` label."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunLabelled(registries))
    return registry


def resolve_metrics_port(config_port: int | None, environ: Mapping[str, str] | None = None) -> int | None:
    """The port to serve on: `run.metrics_port`, else FOXHUNT_METRICS_PORT (empty = 9400), else None."""
    if config_port is not None:
        return config_port
    env = os.environ if environ is None else environ
    raw = env.get("FOXHUNT_METRICS_PORT")
    if raw is None:
        return None
    if raw.strip() == "":
        return DEFAULT_METRICS_PORT
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"FOXHUNT_METRICS_PORT must be a port number, got {raw!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"FOXHUNT_METRICS_PORT must be in 0..65535, got {port}")
    return port


@dataclass
class Exporter:
    """A running `/metrics` server; `port` is the bound one (useful when asked for port 0)."""

    server: WSGIServer
    port: int

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> Exporter:
    """Serve `registry` on http://addr:port/metrics from a daemon thread."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return Exporter(server=server, port=server.server_port)


def push(registry: CollectorRegistry, url: str, job_id: str, job: str = PUSH_JOB, timeout: float = 10.0) -> None:
    """Replace the Pushgateway group of `job_id` with a snapshot of `registry`.

    The group key is `instance=<job_id>`, so pushed series carry the same `(job, instance)` pair as
    their `foxhunt_train_info` and the dashboards' info join stays one-to-one per job.
    """
    if not job_id:
        raise ValueError("push needs a job id (FOXHUNT_JOB_ID)")
    push_to_gateway(url, job=job, registry=registry, grouping_key={"instance": job_id}, timeout=timeout)


@dataclass(frozen=True)
class BenchResult:
    """One plan's measured mean step time on one benchmark configuration."""

    plan: str
    config: str
    step_seconds: float


def export_bench(registry: CollectorRegistry, results: Iterable[BenchResult]) -> Gauge:
    """`foxhunt_bench_step_seconds{plan,config}`: speed-up over eager is eager's value / a plan's."""
    gauge = Gauge(
        "foxhunt_bench_step_seconds",
        f"Mean step time measured by the benchmark. plan: {plan_names('|')}, or one of them with a precision "
        "suffix; config: name of the benchmarked configuration.",
        ["plan", "config"],
        registry=registry,
    )
    for result in results:
        if result.step_seconds <= 0:
            raise ValueError(f"bench step time of {result.plan}/{result.config} must be positive")
        gauge.labels(result.plan, result.config).set(result.step_seconds)
    return gauge


BENCH_PUSH_JOB = "foxhunt-bench"


def push_bench(document: Mapping[str, Any], url: str, job_id: str) -> None:
    """Export a benchmark document's measured rows (`python -m trainer bench`) and push them."""
    registry = CollectorRegistry()
    export_bench(
        registry,
        [
            BenchResult(plan=row["method"], config=row["config"], step_seconds=row["ms_median"] / 1e3)
            for row in document["results"]
            if row["error"] is None
        ],
    )
    push(registry, url, job_id, job=BENCH_PUSH_JOB)
