"""StepTimer: what it measures, when it reads back, how much memory it keeps, and the log line."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from trainer.runtime.timing import EAGER_COMPONENTS, STEP, Interleaved, StepTimer, format_breakdown


class FakeClock:
    """Stands in for `time` in trainer.runtime.timing: time moves only when a test says, so spans are exact."""

    def __init__(self) -> None:
        self.now_ns = 1_000_000_000

    def perf_counter_ns(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += round(seconds * 1e9)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr("trainer.runtime.timing.time", fake)
    return fake


def test_on_the_cpu_sections_read_the_real_monotonic_clock() -> None:
    """Without the fake clock: a section around a 2 ms spin measures at least those 2 ms."""
    timer = StepTimer(torch.device("cpu"))
    with timer.section("sample"):
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:  # spin, not sleep: the clock must see the work
            pass
    timer.end_step()
    drained = timer.drain()
    assert drained["sample"][0] >= 0.002
    assert drained[STEP][0] >= drained["sample"][0]


def test_sections_measure_their_work_and_the_step_spans_them(clock: FakeClock) -> None:
    timer = StepTimer(torch.device("cpu"))
    with timer.section("sample"):
        clock.advance(0.002)
    clock.advance(0.001)  # between sections: in the step, in no component
    with timer.section("forward_backward"):
        clock.advance(0.004)
    timer.end_step()
    drained = timer.drain()
    assert drained == {
        "sample": [pytest.approx(0.002)],
        "forward_backward": [pytest.approx(0.004)],
        STEP: [pytest.approx(0.007)],
    }


def test_begin_step_starts_the_step_before_the_first_section(clock: FakeClock) -> None:
    timer = StepTimer("cpu")
    timer.begin_step()
    clock.advance(0.003)
    with timer.section("adam"):
        pass
    timer.end_step()
    drained = timer.drain()
    assert drained[STEP] == [pytest.approx(0.003)]
    assert drained["adam"] == [0.0]  # nothing ran inside it


def test_repeated_component_in_one_step_is_summed(clock: FakeClock) -> None:
    timer = StepTimer("cpu")
    for seconds in (0.002, 0.005):
        with timer.section("sample"):
            clock.advance(seconds)
    timer.end_step()
    assert timer.drain()["sample"] == [pytest.approx(0.007)]


def test_drain_returns_each_step_once_and_means_are_independent_of_drain() -> None:
    timer = StepTimer("cpu")
    for _ in range(3):
        with timer.section("ema"):
            pass
        timer.end_step()
    assert len(timer.drain()["ema"]) == 3
    assert timer.drain() == {}
    means = timer.means_ms()
    assert set(means) == {"ema", STEP}
    assert timer.steps_timed == 3


def test_each_reader_drains_every_step_once() -> None:
    timer = StepTimer("cpu")
    timer.add_reader("metrics")
    for _ in range(2):
        with timer.section("iqn"):
            pass
        timer.end_step()
    assert len(timer.drain()["iqn"]) == 2
    assert len(timer.drain(reader="metrics")["iqn"]) == 2
    assert timer.drain(reader="metrics") == {}
    with pytest.raises(ValueError, match="unknown reader"):
        timer.drain(reader="dashboard")


def test_means_average_a_periodic_component_over_all_steps(clock: FakeClock) -> None:
    timer = StepTimer("cpu")
    for step in range(4):
        with timer.section("forward_backward"):
            clock.advance(0.001)
        if step == 0:
            with timer.section("causal"):
                clock.advance(0.004)
        timer.end_step()
    assert timer.drain()["causal"] == [pytest.approx(0.004)]
    means = timer.means_ms()
    assert means == {"forward_backward": pytest.approx(1.0), "causal": pytest.approx(1.0), STEP: pytest.approx(2.0)}
    assert timer.means_ms(window=3).get("causal") is None


def test_memory_is_bounded_by_capacity() -> None:
    timer = StepTimer("cpu", capacity=3)
    for _ in range(10):
        with timer.section("sample"):
            pass
        timer.end_step()
    assert len(timer.drain()["sample"]) == 3
    assert timer.steps_timed == 10
    assert len(timer._ring) == 3


def test_disabled_timer_runs_the_work_and_records_nothing() -> None:
    timer = StepTimer("cpu", enabled=False)
    ran = []
    with timer.section("sample"):
        ran.append(1)
    timer.begin_step()
    timer.end_step()
    assert ran == [1]
    assert timer.drain() == {}
    assert timer.means_ms(10) == {}


def test_bad_input_is_refused_with_a_clear_message() -> None:
    timer = StepTimer("cpu")
    with pytest.raises(RuntimeError, match="end_step"):
        timer.end_step()
    with pytest.raises(ValueError, match="component name"), timer.section("Forward Backward"):
        pass
    with pytest.raises(ValueError, match="component name"), timer.section(STEP):
        pass
    with pytest.raises(ValueError, match="component name"), timer.section("forward\n"):  # a label of its own
        pass
    with pytest.raises(ValueError, match="record_span takes CUDA events"):
        timer.record_span("graph", object(), object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capacity"):
        StepTimer("cpu", capacity=0)
    with pytest.raises(ValueError, match="window"):
        timer.means_ms(window=0)


def test_drain_from_another_thread_loses_and_duplicates_nothing() -> None:
    """The exporter drains at scrape time from its own thread while the loop keeps stepping."""
    timer = StepTimer("cpu")
    seen: list[float] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            seen.extend(timer.drain().get("sample", []))

    thread = threading.Thread(target=scrape)
    thread.start()
    for _ in range(2000):
        with timer.section("sample"):
            pass
        timer.end_step()
    stop.set()
    thread.join()
    seen.extend(timer.drain().get("sample", []))
    assert len(seen) == 2000


def test_format_breakdown_sums_the_fused_part_and_lists_every_component() -> None:
    means = {"sample": 0.1234, "forward_backward": 2.0, "adam": 0.5, "guard": 0.01, "zeta": 0.25, STEP: 3.0}
    line = format_breakdown("eager", means)
    assert line == (
        "Training step breakdown: sample=0.123ms fused=2.750ms guard=0.010ms "
        "(per-step: sample=0.123ms forward_backward=2.000ms adam=0.500ms guard=0.010ms zeta=0.250ms "
        "step=3.000ms) plan=eager"
    )


def test_format_breakdown_of_a_graphed_plan() -> None:
    line = format_breakdown("dual", {"sample": 0.05, "graph": 1.5, "aux_stream": 0.7, "guard": 0.002})
    assert line.startswith("Training step breakdown: sample=0.050ms fused=2.200ms guard=0.002ms (per-step: ")
    assert "graph=1.500ms aux_stream=0.700ms" in line


def test_format_breakdown_keeps_collection_out_of_the_fused_part() -> None:
    means = {"act": 0.2, "env": 0.5, "store": 0.05, "graph": 0.4, STEP: 1.2}
    line = format_breakdown("graph", means)
    assert line.startswith("Training step breakdown: sample=0.000ms fused=0.400ms guard=0.000ms collect=0.750ms ")
    assert "(per-step: act=0.200ms env=0.500ms store=0.050ms graph=0.400ms step=1.200ms)" in line


def test_interleaved_times_the_wrapped_calls_apart_from_the_block(clock: FakeClock) -> None:
    timer = StepTimer("cpu")
    with Interleaved(timer, "env", "act") as split:
        clock.advance(0.003)
        act = split.wrap(clock.advance)
        act(0.006)
        clock.advance(0.002)
    timer.end_step()
    drained = timer.drain()
    assert drained["act"] == [pytest.approx(0.006)]
    assert drained["env"] == [pytest.approx(0.005)]  # both parts of the block, not the call
    assert drained[STEP] == [pytest.approx(0.011)]


def test_interleaved_closes_its_span_when_the_wrapped_call_raises() -> None:
    timer = StepTimer("cpu")

    def fail() -> None:
        raise RuntimeError("env broke")

    with pytest.raises(RuntimeError, match="env broke"), Interleaved(timer, "env", "act") as split:
        split.wrap(fail)()
    timer.end_step()
    assert set(timer.drain()) == {"env", "act", STEP}


def test_eager_component_names_are_valid_labels() -> None:
    timer = StepTimer("cpu")
    for name in EAGER_COMPONENTS:
        with timer.section(name):
            pass
    timer.end_step()
    assert set(timer.drain()) == {*EAGER_COMPONENTS, STEP}


# ---- CUDA (run on a GPU machine with -m gpu) -----------------------------------------------------

cuda = pytest.mark.gpu


@cuda
def test_cuda_read_back_waits_for_the_device_without_syncing_the_step() -> None:
    device = torch.device("cuda")
    timer = StepTimer(device)
    a = torch.randn(4096, 4096, device=device)
    torch.cuda.synchronize()
    with timer.section("forward_backward"):
        for _ in range(20):
            a = (a @ a).tanh_()
    timer.end_step()
    assert timer.pending == 1
    assert timer.drain() == {}  # the GPU is still busy: nothing is read, nothing waits
    drained = timer.drain(block=True)
    assert drained["forward_backward"][0] > 1e-4
    assert drained[STEP][0] >= drained["forward_backward"][0]


@cuda
def test_cuda_events_are_reused_and_caller_spans_are_recorded() -> None:
    device = torch.device("cuda")
    timer = StepTimer(device)
    x = torch.randn(256, 256, device=device)
    side = torch.cuda.Stream(device)
    own = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for _ in range(50):
        with timer.section("sample"):
            y = x @ x
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            own[0].record(side)
            z = y @ y
            own[1].record(side)
        timer.record_span("aux_stream", own[0], own[1])
        torch.cuda.current_stream().wait_stream(side)
        timer.end_step()
        timer.drain(block=True)
    assert z.isfinite().all()
    assert len(timer._pool) <= 3  # start of the step doubles as the first section's start
    assert set(timer.means_ms(10)) == {"sample", "aux_stream", STEP}


@cuda
def test_cuda_measuring_costs_under_two_percent_of_an_eager_like_step() -> None:
    """Many small kernels per component, as in the eager plan: timing adds two event records each."""
    device = torch.device("cuda")
    x = torch.randn(1024, 256, device=device)
    w = torch.randn(256, 256, device=device)

    def step(timer: StepTimer) -> None:
        for name in EAGER_COMPONENTS:
            with timer.section(name):
                y = x
                for _ in range(40):  # ~80 kernels per component: an ~8-16 ms launch-bound step
                    y = torch.relu(y @ w)
        timer.end_step()

    timers = {True: StepTimer(device, enabled=True), False: StepTimer(device, enabled=False)}

    def run(enabled: bool) -> float:
        timer = timers[enabled]
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(100):
            step(timer)
            if i % 10 == 9:
                timer.drain()  # what the exporter does at scrape time, here far more often
        torch.cuda.synchronize()
        return time.perf_counter() - start

    run(True), run(False)
    pairs = [(run(True), run(False)) for _ in range(7)]  # interleaved, so drift hits both alike
    on = min(p[0] for p in pairs)
    off = min(p[1] for p in pairs)
    assert (on - off) / off <= 0.02, f"timing overhead {100 * (on - off) / off:.2f}%"
