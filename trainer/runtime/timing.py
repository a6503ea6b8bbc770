"""Per-component step timing that never synchronises the host inside a step.

On CUDA each section is a pair of `torch.cuda.Event(enable_timing=True)` recorded on the current
stream; the events are read back later (`drain`, `means_ms`), only once the GPU has passed them, so
timing a step costs two event records per component and no sync. On CPU the work is synchronous and
a monotonic clock (`time.perf_counter_ns`) is exact. `enabled=False` turns every call into a no-op,
which is how the benchmark measures the cost of measuring.

Components of one step with the same name are summed (a plan may sample twice). A component that
does not run every step (causal) is absent from the steps it skips; `means_ms` averages
over all steps of the window, so the components add up to the step time.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

import torch

P = ParamSpec("P")
R = TypeVar("R")

STEP = "step"
"""The whole-step span recorded by `end_step`, from `begin_step` (or the first section) to its end."""

DEFAULT_READER = "loop"
"""The reader `drain()` serves unless told otherwise."""

COLLECT_COMPONENTS: tuple[str, ...] = ("act", "env", "store", "collect_graph")
"""Collection's components in online training, before the update: the policy's forward (`act`), the rest
of a collect call (the epsilon draw and stepping the environments, `env`) and writing the rows into the
replay (`store`); or, when collection replays as one CUDA graph (run.collect_graph), the three together
(`collect_graph`: a graph's parts cannot be timed apart)."""

EAGER_COMPONENTS: tuple[str, ...] = (
    "sample",
    "spectral",
    "forward_backward",
    "clip_prune",
    "adam",
    "ema",
    "attention",
    "iql",
    "iqn",
    "causal",
    "guard",
    "priority",
)
"""Component names of the eager plan, in step order (also the order of the breakdown line). The ensemble
and vaccine losses are inside `forward_backward`: their backward is a row of the heads' batched backward, as is
IQN's share of the trunk's (`iqn` times IQN's own layers, forward and backward)."""

GRAPH_COMPONENTS: tuple[str, ...] = ("sample", "graph", "aux_stream", "guard")
"""Component names every graphed plan uses (a plan may add its own)."""

_NAME = re.compile(r"[a-z][a-z0-9_]*")  # fullmatch: `$` would pass "a\n"
_CPU = "cpu"


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name) or name == STEP:
        raise ValueError(f"component name {name!r} must match [a-z][a-z0-9_]* and not be {STEP!r}")


@dataclass
class _Step:
    """One step's recorded marks: CUDA event pairs or perf_counter_ns pairs, by component."""

    spans: list[tuple[str, object, object, bool]] = field(default_factory=list)
    start: object | None = None
    end: object | None = None


class StepTimer:
    """Times named components of each training step; see the module docstring for the model.

    `capacity` bounds memory: the ring of read-back steps (for `means_ms`), the undrained steps
    (for `drain`) and the steps whose events the GPU has not reached yet. If the GPU falls more than
    `capacity` steps behind, the oldest pending step is waited for (a rare, bounded sync).
    """

    def __init__(self, device: torch.device | str, enabled: bool = True, capacity: int = 2000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.device = torch.device(device)
        self.enabled = enabled
        self.capacity = capacity
        self._cuda = self.device.type == "cuda"
        if self._cuda and not torch.cuda.is_available():
            raise ValueError(f"StepTimer on {self.device} but CUDA is not available")
        self._lock = threading.Lock()
        self._pool: list[torch.cuda.Event] = []
        self._stream: torch.cuda.Stream | None = None
        self._names: set[str] = set()
        self._current: _Step | None = None
        self._pending: deque[_Step] = deque()
        self._ring: deque[dict[str, float]] = deque(maxlen=capacity)
        # One queue per reader (the loop's log line, the metrics exporter): each sees every step.
        self._undrained: dict[str, deque[dict[str, float]]] = {DEFAULT_READER: deque(maxlen=capacity)}
        self.steps_timed = 0

    # ---- marks -------------------------------------------------------------------------------

    def _mark(self) -> object:
        """A point in time on the step's stream: a recorded event (CUDA) or ns of the clock."""
        if not self._cuda:
            return time.perf_counter_ns()
        with self._lock:
            event = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)
        event.record(self._stream)
        return event

    def _step(self) -> _Step:
        if self._current is None:
            self._current = _Step()
            if self._cuda:
                self._stream = torch.cuda.current_stream(self.device)
        return self._current

    def begin_step(self) -> None:
        """Start the whole-step span explicitly (otherwise it starts at the step's first section)."""
        if not self.enabled:
            return
        step = self._step()
        if step.start is None:
            step.start = self._mark()

    def section(self, name: str) -> _Section:
        """Time the enclosed work of the current step as component `name` (a context manager).

        On CUDA both marks go on the stream that was current when the step began (looking the
        current stream up costs more than recording an event); time other streams with record_span.
        """
        if name not in self._names:
            _check_name(name)
            self._names.add(name)
        return _Section(self, name)

    def record_span(self, name: str, start: torch.cuda.Event, end: torch.cuda.Event) -> None:
        """Add a span timed by the caller's own events (graph segments, the aux stream).

        The events stay the caller's: they are read, never reused by the timer. Record them before
        `end_step` and do not re-record them until this step has been read back.
        """
        if not self.enabled:
            return
        _check_name(name)
        if not self._cuda:
            raise ValueError("record_span takes CUDA events; on CPU use section()")
        self._step().spans.append((name, start, end, False))

    def end_step(self) -> None:
        """Close the current step; its times become readable once the device has passed them."""
        if not self.enabled:
            return
        step = self._current
        if step is None or step.start is None:
            raise RuntimeError("end_step() without begin_step() or a section in this step")
        step.end = self._mark()
        self._current = None
        with self._lock:
            self._pending.append(step)
            overflow = len(self._pending) > self.capacity
        if overflow:
            self._collect(block_oldest=True)

    # ---- read-back ---------------------------------------------------------------------------

    def _ready(self, step: _Step) -> bool:
        if not self._cuda:
            return True
        if not step.end.query():  # type: ignore[attr-defined]
            return False
        return all(end.query() for _, _, end, _ in step.spans)  # type: ignore[attr-defined]

    def _seconds(self, start: object, end: object) -> float:
        if self._cuda:
            return start.elapsed_time(end) / 1e3  # type: ignore[attr-defined]
        return (end - start) / 1e9  # type: ignore[operator]

    def _read(self, step: _Step) -> dict[str, float]:
        times: dict[str, float] = {}
        for name, start, end, _ in step.spans:
            times[name] = times.get(name, 0.0) + self._seconds(start, end)
        times[STEP] = self._seconds(step.start, step.end)
        if self._cuda:
            owned = [step.start, step.end]
            for _, start, end, mine in step.spans:
                if mine:
                    owned += [start, end]
            # The step's start is also its first section's start: return each event once.
            unique = {id(event): event for event in owned}
            self._pool.extend(unique.values())  # type: ignore[arg-type]
        return times

    def _collect(self, block: bool = False, block_oldest: bool = False) -> None:
        """Move every step the device has finished from pending to the ring and the undrained list."""
        with self._lock:
            if block and self._cuda and self._pending:
                torch.cuda.synchronize(self.device)
            if block_oldest and self._cuda and self._pending:
                oldest = self._pending[0]
                for _, _, end, _ in oldest.spans:
                    end.synchronize()  # type: ignore[attr-defined]
                oldest.end.synchronize()  # type: ignore[attr-defined]
            while self._pending and self._ready(self._pending[0]):
                times = self._read(self._pending.popleft())
                self._ring.append(times)
                for queue in self._undrained.values():
                    queue.append(times)
                self.steps_timed += 1

    def add_reader(self, reader: str) -> None:
        """Give `reader` its own drain queue, so that draining elsewhere takes nothing from it."""
        with self._lock:
            self._undrained.setdefault(reader, deque(maxlen=self.capacity))

    def drain(self, block: bool = False, reader: str = DEFAULT_READER) -> dict[str, list[float]]:
        """Seconds per component for each step read back since `reader`'s last drain (oldest first).

        Non-blocking by default: steps the GPU has not finished stay pending for a later call.
        `block=True` synchronises the device once, so every closed step is returned. Each reader
        (see `add_reader`) gets every step once, whoever else drains.
        """
        if not self.enabled:
            return {}
        if reader not in self._undrained:
            raise ValueError(f"unknown reader {reader!r}; call add_reader({reader!r}) first")
        self._collect(block=block)
        out: dict[str, list[float]] = {}
        with self._lock:
            queue = self._undrained[reader]
            while queue:
                for name, seconds in queue.popleft().items():
                    out.setdefault(name, []).append(seconds)
        return out

    def means_ms(self, window: int | None = None, block: bool = False) -> dict[str, float]:
        """Mean milliseconds per step of each component over the last `window` read-back steps.

        Independent of `drain`: both see every step. A component absent from some steps counts as
        0 there, so the components' means add up to the mean step time (minus untimed gaps).
        """
        if not self.enabled:
            return {}
        if window is not None and window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self._collect(block=block)
        with self._lock:
            steps = list(self._ring)[-window:] if window else list(self._ring)
        if not steps:
            return {}
        totals: dict[str, float] = {}
        for times in steps:
            for name, seconds in times.items():
                totals[name] = totals.get(name, 0.0) + seconds
        return {name: 1e3 * total / len(steps) for name, total in totals.items()}

    @property
    def pending(self) -> int:
        """Closed steps whose events the device has not passed yet."""
        return len(self._pending)


class _Section:
    """The context of one `StepTimer.section` (a class, not a generator: it is entered ~15 times a step)."""

    __slots__ = ("_name", "_start", "_step", "_timer")

    def __init__(self, timer: StepTimer, name: str) -> None:
        self._timer = timer
        self._name = name

    def __enter__(self) -> None:
        timer = self._timer
        if not timer.enabled:
            return
        self._step = timer._step()
        self._start = timer._mark()
        if self._step.start is None:
            self._step.start = self._start

    def __exit__(self, *exc: object) -> None:
        if self._timer.enabled:
            self._step.spans.append((self._name, self._start, self._timer._mark(), True))


class Interleaved:
    """Time a block as component `outer`, except the calls made through `wrap(fn)`, timed as `inner`.

    The spans do not overlap, so the two components add up to the block: e.g. a collect call is `env`
    around the policy's forward, `act`, which the source calls in the middle of it.
    """

    def __init__(self, timer: StepTimer, outer: str, inner: str) -> None:
        self.timer, self.outer, self.inner = timer, outer, inner
        self._open: _Section | None = None

    def _start(self) -> None:
        self._open = self.timer.section(self.outer)
        self._open.__enter__()

    def _stop(self) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None

    def __enter__(self) -> Interleaved:
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def wrap(self, fn: Callable[P, R]) -> Callable[P, R]:
        """`fn`, timed as `inner` and left out of `outer`."""

        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            self._stop()
            try:
                with self.timer.section(self.inner):
                    return fn(*args, **kwargs)
            finally:
                self._start()

        return call


def _order(names: list[str]) -> list[str]:
    known = [n for n in COLLECT_COMPONENTS + EAGER_COMPONENTS + GRAPH_COMPONENTS if n in names]
    known = list(dict.fromkeys(known))
    return known + sorted(n for n in names if n not in known and n != STEP)


def format_breakdown(plan: str, means_ms: Mapping[str, float]) -> str:
    """The log line: sample, the fused rest, guard, collection (when timed), then every component (ms).

    `fused` is the update's part that is neither sample nor guard (nor collection, nor the whole-step
    span): the part the plan fuses. `collect` is act + env + store, shown when the step collected.
    The whole step follows the per-step list as `step=`.
    """
    components = [name for name in means_ms if name != STEP]
    apart = ("sample", "guard", STEP, *COLLECT_COMPONENTS)
    fused = sum(ms for name, ms in means_ms.items() if name not in apart)
    per_step = " ".join(f"{name}={means_ms[name]:.3f}ms" for name in _order(components))
    if STEP in means_ms:
        per_step = f"{per_step} {STEP}={means_ms[STEP]:.3f}ms".strip()
    collect = ""
    if any(name in means_ms for name in COLLECT_COMPONENTS):
        collect = f" collect={sum(means_ms.get(name, 0.0) for name in COLLECT_COMPONENTS):.3f}ms"
    return (
        f"Training step breakdown: sample={means_ms.get('sample', 0.0):.3f}ms fused={fused:.3f}ms "
        f"guard={means_ms.get('guard', 0.0):.3f}ms{collect} (per-step: {per_step}) plan={plan}"
    )
