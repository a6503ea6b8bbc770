"""The torch market's collection as one CUDA graph per plan call (run.collect_graph).

Before each plan call the loop collects the rows of its K updates: M = K x `data.env_steps_per_update`
steps of the N market envs, each acting epsilon-greedily with the current network, stepping the
market and storing the rows (HER columns included). On the torch market all of it is device work
(`TorchMarketSource.step_rows`), and with the replay writer's bookkeeping on the device too
(`DeviceRingWriter`) nothing in it depends on a host value that changes from call to call, except:

- epsilon: update u's is `linear_epsilon(u)`, computed on the device from a step scalar (`step_base`,
  filled before each replay as the graph plans fill theirs), bit for bit the host's value;
- which steps end episodes: the market's envs start together and last exactly `horizon` steps, so
  the host knows from its step counter; one graph per pattern of episode ends within the M steps
  (`ends`), captured up front for every phase the run goes through (two for examples/market-gpu.yaml:
  none, and the last step).

The random draws (epsilon-greedy's, the market's noise) come from generators registered with each
graph, so every replay continues their streams as uncaptured collection would. Capturing warms the
body up on real data (as the plans do), so everything the warm-up touches (replay storage, sampler
and writer, the market's state, the returns, the generators) is saved first and restored after.
After a replay, the host's own bookkeeping follows (`DeviceRingWriter.replayed`,
`TorchMarketSource.advance`): the host code in the body ran only while capturing.

On the CPU (no graphs) the same body runs uncaptured; the tests compare it with `trainer.runtime.train`'s
collection. A graph's act, env and store cannot be timed apart inside it: the loop times the replay
as one component, `collect_graph`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from contracts.config import DataConfig
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.replay.writer import DeviceRingWriter
from trainer.execution.data.gym_source import GreedyFn
from trainer.execution.data.market_torch import TorchMarketSource
from trainer.execution.plans._capture import capture


def device_epsilon(step: Tensor, start: float, end: float, decay_steps: Tensor) -> Tensor:
    """`linear_epsilon` on the device, bit for bit: start + (end - start) * min(max(step, 0) / decay, 1).

    float64 throughout; the division is by a device scalar `decay_steps` (float64), since CUDA divides
    by a host scalar through its reciprocal, which rounds differently from Python's true division.
    """
    frac = torch.clamp(step.to(torch.float64).clamp(min=0.0) / decay_steps, max=1.0)  # []
    return (end - start) * frac + start  # []


class Phase(NamedTuple):
    """Where a block of M collection steps starts: the market's episode step and the steps taken."""

    t: int
    steps: int

    def ends(self, horizon: int) -> tuple[bool, ...]:
        """Per step of the block, whether every env's episode ends there."""
        return tuple((self.t + j + 1) % horizon == 0 for j in range(self.steps))


def collect_graph_applies(source: object, device: torch.device, steps: int) -> bool:
    """Whether collection of `steps` steps per plan call can be one graph: the torch market on a CUDA
    device, with at most one episode end per block (`steps` <= horizon)."""
    return (
        isinstance(source, TorchMarketSource)
        and device.type == "cuda"
        and torch.cuda.is_available()
        and steps <= source.params.horizon
    )


class Replayable(Protocol):
    """A captured body: each `replay` runs its device work again (a `torch.cuda.CUDAGraph`)."""

    def replay(self) -> None: ...


CaptureFn = Callable[[Callable[[], None], Sequence[torch.Generator]], Replayable]
"""Captures a body drawing from the given generators (registered with the graph)."""


class CudaCapture:
    """`CaptureFn` of CUDA graphs on `device`: the plans' `capture` (warm-up on a side stream, then one
    captured call), the collection graphs sharing one memory pool (none of them has live outputs)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)

    def __call__(self, body: Callable[[], None], generators: Sequence[torch.Generator]) -> Replayable:
        graph, _ = capture(body, self.pool, self.stream, generators)
        torch.cuda.synchronize(self.device)
        return graph


def graph_capture(device: torch.device) -> CaptureFn | None:
    """How collection is captured on `device`: CUDA graphs, or not at all (None: the body runs uncaptured)."""
    return CudaCapture(device) if device.type == "cuda" else None


class MarketCollector:
    """M steps of the torch market's collection per call, captured as one CUDA graph per episode-end
    pattern (`capture`), or run uncaptured (`capture` None: the CPU, and the equivalence tests)."""

    def __init__(
        self,
        source: TorchMarketSource,
        replay: ReplayBuffer,
        act: GreedyFn,
        data: DataConfig,
        generator: torch.Generator,
        capture: CaptureFn | None,
    ) -> None:
        if not isinstance(replay.writer, DeviceRingWriter):
            raise ValueError("the collection graph needs the replay's bookkeeping on the device (device_writer=True)")
        self.source, self.replay, self.writer, self.act = source, replay, replay.writer, act
        self.generator = generator
        self.capture = capture
        self.horizon = source.params.horizon
        self.env_steps = data.env_steps_per_update
        self.epsilon_start, self.epsilon_end = data.epsilon_start, data.epsilon_end
        device = source.device
        self.decay_steps = torch.tensor(float(data.epsilon_decay_steps), dtype=torch.float64, device=device)
        self.step_base = torch.zeros((), dtype=torch.int64, device=device)
        self.graphs: dict[tuple[bool, ...], Replayable] = {}

    def steps(self, updates: int) -> int:
        """M, the collection steps of `updates` updates."""
        return updates * self.env_steps

    def phases(self, updates: int) -> list[Phase]:
        """One phase per pattern of episode ends that blocks of `updates` updates meet from the market's
        current episode step t0. Blocks start at t0 + k M (mod H), so an end can fall only at positions
        j = r (mod g) of a block, g = gcd(M, H), r = (H - 1 - t0) mod g: one pattern per such j < M, plus
        a block without an end when M < H (the end at M + r, past the block)."""
        steps, horizon = self.steps(updates), self.horizon
        if steps > horizon:
            raise ValueError(f"a collection graph holds at most one episode end: {steps} steps > horizon {horizon}")
        g = math.gcd(steps, horizon)
        r = (horizon - 1 - self.source.episode_step) % g
        ends_at = list(range(r, steps, g)) + ([steps + r] if steps < horizon else [])
        return [Phase((horizon - 1 - j) % horizon, steps) for j in ends_at]

    def prepare(self, updates: int) -> None:
        """Capture the graph of every pattern blocks of `updates` updates will meet (before the timed loop)."""
        if self.capture is not None:
            for phase in self.phases(updates):
                self.graph_for(phase)

    # ---- what one graph runs ----------------------------------------------------------------

    def body(self, phase: Phase) -> None:
        """The block's M steps: epsilon of each update from `step_base`, act, step, store."""
        for j in range(phase.steps):
            epsilon = device_epsilon(
                self.step_base + j // self.env_steps, self.epsilon_start, self.epsilon_end, self.decay_steps
            )
            rows = self.source.step_rows(self.act, epsilon, self.generator, (phase.t + j) % self.horizon)
            self.replay.add(rows)

    # ---- capture and replay -----------------------------------------------------------------

    def generators(self) -> list[torch.Generator]:
        return [self.generator, self.source.market.generator]

    def graph_for(self, phase: Phase) -> Replayable:
        """The graph of `phase`'s pattern of episode ends, captured from that phase if it is new.

        Phases of one pattern differ only in the rows' host `episode_step`, which `add` does not store.
        """
        if self.capture is None:
            raise ValueError("this collector runs uncaptured (capture=None)")
        key = phase.ends(self.horizon)
        graph = self.graphs.get(key)
        if graph is None:
            saved = Saved(self)
            graph = self.capture(functools.partial(self.body, phase), self.generators())
            saved.restore()
            self.graphs[key] = graph
        return graph

    def run(self, step: int, updates: int) -> None:
        """Collect the rows of updates step .. step + updates - 1 into the replay."""
        phase = Phase(self.source.episode_step, self.steps(updates))
        self.step_base.fill_(step)
        if self.capture is not None:
            self.graph_for(phase).replay()
            self.writer.replayed(phase.steps)
        else:
            self.body(phase)
        self.source.advance(phase.steps, ended=any(phase.ends(self.horizon)))


class Saved:
    """Copies of everything a collection body writes, to undo a capture's warm-up."""

    def __init__(self, collector: MarketCollector) -> None:
        self.collector = collector
        self.tensors = [tensor.clone() for tensor in self.live()]
        self.written = collector.writer.written
        self.rng = [generator.get_state() for generator in collector.generators()]

    def live(self) -> list[Tensor]:
        return [*self.collector.replay.state_dict().values(), *self.collector.source.device_state()]

    def restore(self) -> None:
        with torch.no_grad():
            for tensor, saved in zip(self.live(), self.tensors, strict=True):
                tensor.copy_(saved)
        self.collector.writer.written = self.written
        for generator, rng in zip(self.collector.generators(), self.rng, strict=True):
            generator.set_state(rng)
