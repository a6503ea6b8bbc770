"""The graph plan: the whole update in ONE CUDA graph per periodic variant, sampling included.

PER sampling from the device sum-tree, the gathers of rows and attention windows straight from the
GPU replay, HER relabelling, the random draws, then spectral norm, forward, CQL, budget clipping,
pruning, Adam, IQL, attention, the guard, the target EMA and the priority write-back are captured
from `ReplayBuffer.sample_into`, `Draws.fill_` and `train_step` over static buffers, K =
`run.steps_per_replay` times per graph. A replay is one host call (`step_base.fill_`, the replay);
the host's work between replays is collecting: acting, stepping the environments and writing the
new rows into the replay's static storage, on the same stream, so the next replay samples them.

- The replay's and the draws' generators are registered with each graph, so every replay continues
  their random streams: the same numbers eager code draws from the same state.
- The step number reaches the graph as a device scalar (`step_base` + k, all K of them in one kernel),
  for PER's beta schedule.
- No host sync anywhere: Adam's bias correction reads `state.updates` on the device, the guard skips
  with `torch.where`.
- Periodic work (vaccine every 10th step, causal every 100th): one graph per pattern of StepFlags over
  the K steps, picked on the host from the step number (`flag_patterns`).
- A HER goal reward that calls the host cannot be captured: such runs sample outside the graph (one
  update per replay, with a warning), as do the equivalence tests' `update(batch, draws, step)`, which
  replays update-only graphs on batches they give.
- Capturing warms the body up on real data, so a plan is built once the replay holds transitions
  (`trainer.runtime.train` builds it after the warm-up to `learning_starts`).
"""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple

import torch

from trainer.algo.batch import Batch
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.step import NO_TIMER, Draws, SectionTimer, StepFlags, StepOutput, train_step
from trainer.execution.plans._capture import (
    Pattern,
    Snapshot,
    StreamRouter,
    capture,
    flag_patterns,
    matmul_precision,
    unique_generators,
)
from trainer.execution.plans.base import BasePlan


class GraphKey(NamedTuple):
    """One captured graph: K sampled updates (`sampled`), or one update on a given batch."""

    sampled: bool
    flags: Pattern


class GraphPlan(BasePlan):
    """Sampling and the update in one graph replay, K updates per replay."""

    name = "graph"
    streams = False
    """Run attention and IQL on side streams inside the graph (the dual plan and later)."""

    def build(self) -> None:
        config = self.config
        self.sample_in_graph = self.can_sample_in_graph(self.replay)
        self.steps_per_call = config.run.steps_per_replay if self.sample_in_graph else 1
        self.step_base = torch.zeros((), dtype=torch.int64, device=self.device)
        self.step_offsets = torch.arange(self.steps_per_call, dtype=torch.int64, device=self.device)  # [K]
        # Valid values for a fed graph's warm-up before its first real fill (empty memory may hold any index).
        self.draws.tau.fill_(0.5)
        self.draws.tau_target.fill_(0.5)
        self.draws.perm.copy_(torch.arange(config.run.batch_size, device=self.device))
        self.router = StreamRouter(self.device) if self.streams else None
        self.pool = torch.cuda.graph_pool_handle()
        self.capture_stream = torch.cuda.Stream(self.device)
        self.graphs: dict[GraphKey, tuple[torch.cuda.CUDAGraph, StepOutput]] = {}
        self.prepare()

    def can_sample_in_graph(self, replay: ReplayBuffer) -> bool:
        """Whether sampling can be captured; if not, warn and sample outside the graph."""
        her = replay.her
        if her is None or her.goal.capturable:
            return True
        warnings.warn(
            f"plan {self.name!r}: this env's HER goal reward calls the host, so sampling runs outside the "
            "graph (one update per replay)",
            RuntimeWarning,
            stacklevel=3,
        )
        return False

    # ---- what one captured graph runs -------------------------------------------------------

    def train(self, flags: StepFlags, timer: SectionTimer) -> StepOutput:
        """The maths of one update over the static buffers (the fused plan swaps in its compiled form)."""
        return train_step(self.state, self.batch, self.draws, self.hp, flags, timer)

    def sample_batch(self, step: torch.Tensor) -> None:
        """Step `step`'s batch into the static buffers (the fused plan compiles the gathers)."""
        self.replay.sample_into(self.batch, step)

    def write_priorities(self, output: StepOutput) -> None:
        """The update's per-sample losses back into the replay's priorities (compiled in the fused plan)."""
        self.replay.update_priorities(self.batch.index, output.priority)

    def update_body(self, flags: StepFlags) -> StepOutput:
        """One update and its priority write-back, streams forked and joined inside."""
        timer: SectionTimer = NO_TIMER
        if self.router is not None:
            self.router.begin()
            timer = self.router
        output = self.train(flags, timer)
        self.write_priorities(output)
        if self.router is not None:
            self.router.join()
        return output

    def body(self, key: GraphKey) -> StepOutput:
        """What graph `key` runs: per update, sample and draw (when sampled), update, write back."""
        output: StepOutput | None = None
        if key.sampled:  # the K updates' step scalars: one kernel per replay, not one per update
            steps = (self.step_base + self.step_offsets).unbind(0)
        for i, flags in enumerate(key.flags):
            if key.sampled:
                self.sample_batch(steps[i])
                self.draws.fill_(self.generator)
            output = self.update_body(flags)
        assert output is not None
        return output

    def variants(self) -> list[GraphKey]:
        """Keys of the graphs the schedule produces, captured up front."""
        if self.sample_in_graph:
            return [GraphKey(True, pattern) for pattern in flag_patterns(self.config, self.steps_per_call)]
        return [GraphKey(False, pattern) for pattern in flag_patterns(self.config, 1)]

    def generators(self) -> list[torch.Generator]:
        """Generators the captured bodies draw from (the replay's and the draws')."""
        return unique_generators(self.replay.generator, self.generator)

    # ---- capture and replay -----------------------------------------------------------------

    def prepare(self) -> None:
        """Capture every variant the schedule can produce, before the first step is timed."""
        self.capture_keys(self.variants())

    def capture_keys(self, keys: list[GraphKey]) -> None:
        """Capture `keys`; the warm-up's writes to state, priorities and generators are undone."""
        if len(self.replay) == 0:
            raise ValueError(f"plan {self.name!r} captures on real samples: build it once the replay holds transitions")
        generators = self.generators()
        snapshot = Snapshot(self.state, self.replay, generators)
        with matmul_precision(self.tf32):
            for key in keys:
                body = functools.partial(self.body, key)
                self.graphs[key] = capture(body, self.pool, self.capture_stream, generators)
        snapshot.restore()
        torch.cuda.synchronize(self.device)

    def graph_for(self, key: GraphKey) -> tuple[torch.cuda.CUDAGraph, StepOutput]:
        """The graph of `key`, captured now if the schedule reached a variant not captured up front."""
        if key not in self.graphs:
            self.capture_keys([key])
        return self.graphs[key]

    def run(self, step: int) -> StepOutput:
        if not self.sample_in_graph:
            self.sample(step)
            graph, output = self.graph_for(GraphKey(False, (StepFlags.for_step(step, self.config),)))
            with self.timer.section("graph"):
                graph.replay()
            return output
        flags = tuple(StepFlags.for_step(step + i, self.config) for i in range(self.steps_per_call))
        graph, output = self.graph_for(GraphKey(True, flags))
        with self.timer.section("graph"):
            self.step_base.fill_(step)
            graph.replay()
        return output

    def update(self, batch: Batch, draws: Draws, step: int) -> StepOutput:
        """Replay step `step`'s update-only graph on a given batch and draws (equivalence tests feed eager's)."""
        self.batch.copy_(batch)
        for name in ("tau", "tau_target", "perm"):
            getattr(self.draws, name).copy_(getattr(draws, name))
        graph, output = self.graph_for(GraphKey(False, (StepFlags.for_step(step, self.config),)))
        graph.replay()
        return output
