"""Machinery the graphed plans share: precision scopes, flag variants, state snapshots, capture, streams.

A CUDA graph records the exact kernels (and their precision) chosen while it was captured, and reads
and writes fixed addresses. So each plan captures `train_step` over static buffers once per periodic
variant (`StepFlags`), after a warm-up on a side stream, and restores every tensor the warm-up
touched, so capturing leaves the training state exactly as it found it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar, TypeVar

import torch

from contracts.config import TrainConfig
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.rng import KeyedGenerator
from trainer.algo.state import TrainState
from trainer.algo.step import StepFlags

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # what torch.cuda.graph_pool_handle() returns

T = TypeVar("T")

WARMUP_STEPS = 3
"""Eager runs on the side stream before capture: cuBLAS handles, autograd and the allocator settle."""


def require_cuda(name: str, device: torch.device) -> None:
    """Graphed plans run only on a CUDA device (make_plan falls back to eager before we get here)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"plan {name!r} needs a CUDA device, got {device}")


@contextlib.contextmanager
def matmul_precision(tf32: bool) -> Iterator[None]:
    """Allow TF32 matrix products (cuBLAS and cuDNN) inside the block only, restoring the old setting.

    Captured kernels keep the precision they were captured with, so a TF32 plan's graphs stay TF32
    while eager code elsewhere in the process stays float32.
    """
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def uses_tf32(precision: str, plan_default: bool) -> bool:
    """Whether `run.precision` runs the float32 matrix products in TF32: 'auto' keeps the plan's own
    choice, 'bf16' keeps TF32 for what autocast leaves in float32 (spectral norm's power iteration)."""
    return plan_default if precision == "auto" else precision in ("tf32", "bf16")


def precision_scope(precision: str, default_tf32: bool) -> contextlib.AbstractContextManager[None]:
    """`matmul_precision` for `run.precision` (bf16's autocast itself is `trainer.algo.step.mixed_precision`)."""
    return matmul_precision(uses_tf32(precision, default_tf32))


Pattern = tuple[StepFlags, ...]
"""The StepFlags of the K updates one replay of a sampling graph runs."""


def flag_patterns(config: TrainConfig, k: int) -> list[Pattern]:
    """The distinct StepFlags sequences of K-step windows starting at multiples of K."""
    period = k
    if config.loss.vaccine:
        period = math.lcm(period, config.loss.vaccine_every)
    if config.loss.causal:
        period = math.lcm(period, config.loss.causal_every)
    patterns = (tuple(StepFlags.for_step(start + i, config) for i in range(k)) for start in range(0, period, k))
    return list(dict.fromkeys(patterns))


class Snapshot:
    """Copies of every tensor a warm-up step mutates (state, replay priorities, generators), to restore."""

    def __init__(self, state: TrainState, replay: ReplayBuffer, generators: list[torch.Generator]) -> None:
        self.state, self.replay, self.generators = state, replay, generators
        with torch.no_grad():
            self.tensors = {name: tensor.detach().clone() for name, tensor in state.tensors().items()}
            self.sampler = {name: tensor.clone() for name, tensor in replay.sampler.state_dict().items()}
        self.rng = [generator.get_state() for generator in generators]

    def restore(self) -> None:
        self.state.load_tensors(self.tensors)
        with torch.no_grad():
            for name, tensor in self.replay.sampler.state_dict().items():
                tensor.copy_(self.sampler[name])
        for generator, rng in zip(self.generators, self.rng, strict=True):
            generator.set_state(rng)


def unique_generators(*generators: torch.Generator) -> list[torch.Generator]:
    """The distinct generators among `generators` (the replay and the plan may share one)."""
    seen: dict[int, torch.Generator] = {}
    for generator in generators:
        seen.setdefault(id(generator), generator)
    return list(seen.values())


def capture(
    body: Callable[[], T],
    pool: _POOL_HANDLE,
    stream: torch.cuda.Stream,
    generators: Sequence[torch.Generator] = (),
    warmup: int = WARMUP_STEPS,
) -> tuple[torch.cuda.CUDAGraph, T]:
    """Warm `body` up on `stream`, then capture one call of it into a graph sharing memory `pool`.

    Generators used inside `body` are registered with the graph, so each replay draws fresh numbers
    (the same sequence eager code would draw from the same generator state).
    """
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    for generator in generators:
        if not isinstance(generator, KeyedGenerator):  # a keyed one's counters advance on the device, in the graph
            graph.register_generator_state(generator)
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = body()
    return graph, out


class StreamRouter:
    """A `SectionTimer` that moves the step's independent groups onto their own CUDA streams.

    `train_step` names its parts with `timer.section(name)`; this router runs the sections in
    `FORKS` on side streams, each forked from the point its inputs are ready, and joins them all back
    before the guard (which checks their gradients) and at the end of the step. Inside a capture the
    forks and joins become edges of the graph, so the groups overlap with the main network's
    forward/backward. Reads only: every group writes state in the guard's commit, after the join.
    """

    FORKS: ClassVar[dict[str, str]] = {
        "attention": "start",  # reads the batch window and its own parameters: independent of the rest
        "iql": "here",  # reads h_s2 and the target trunk: right after the forward/backward section
    }
    JOINS: ClassVar[frozenset[str]] = frozenset({"guard"})
    """Sections that first wait for every open side stream (the guard checks their gradients)."""

    def __init__(self, device: torch.device) -> None:
        self.streams = {name: torch.cuda.Stream(device) for name in self.FORKS}
        self._start: torch.cuda.Event | None = None
        self._open: list[torch.cuda.Stream] = []

    def begin(self) -> None:
        """Mark the step's start (what every "start" fork may read); call before `train_step`."""
        self._start = self._record()
        self._open = []

    @staticmethod
    def _record() -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream())
        return event

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        fork = self.FORKS.get(name)
        if fork is not None:
            mark = self._record() if fork == "here" else self._start
            if mark is None:
                raise RuntimeError("StreamRouter.begin() must be called before the step")
            side = self.streams[name]
            side.wait_event(mark)
            with torch.cuda.stream(side):
                yield
            self._open.append(side)
            return
        if name in self.JOINS:
            self.join()
        yield

    def join(self) -> None:
        """Make the current stream wait for every side stream forked so far."""
        current = torch.cuda.current_stream()
        for side in self._open:
            current.wait_stream(side)
        self._open = []
