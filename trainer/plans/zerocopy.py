"""Phase 4: sampling inside the graph, K steps per replay.

The fused plan's graph grows to cover the whole loop body: PER sampling from the device sum-tree,
the gathers of rows and attention windows straight from the GPU replay, HER relabelling, the
random draws, the update and the priority write-back, K = `run.steps_per_replay` times. A 2000-step
epoch is 2000 / K replays and one host call per replay (`step_base.fill_`, the replay).

- The generators of the replay and of the draws are registered with each graph, so every replay
  continues their random streams (the same numbers eager code would draw from the same state).
- The step number reaches the graph as a device scalar (`step_base` + k) for PER's beta schedule.
- Periodic work: one graph per pattern of StepFlags over the K steps (e.g. K = 10 with vaccine
  every 10th and causal every 100th step: a vaccine+causal pattern and a vaccine pattern).
- No staging copies exist to double-buffer: the graph gathers from the replay's storage, and the
  host's writes (`ReplayBuffer.add`) are issued on the same stream, so they land between replays.
"""

from __future__ import annotations

import math

import torch

from trainer.batch import Batch
from trainer.config import TrainConfig
from trainer.plans.fused import FusedPlan
from trainer.replay.buffer import ReplayBuffer
from trainer.state import TrainState
from trainer.step import Draws, SectionTimer, StepFlags, StepOutput

Pattern = tuple[StepFlags, ...]


def flag_patterns(config: TrainConfig, k: int) -> list[Pattern]:
    """The distinct StepFlags sequences of K-step windows starting at multiples of K."""
    period = k
    if config.loss.vaccine:
        period = math.lcm(period, config.loss.vaccine_every)
    if config.loss.causal:
        period = math.lcm(period, config.loss.causal_every)
    patterns = (tuple(StepFlags.for_step(start + i, config) for i in range(k)) for start in range(0, period, k))
    return list(dict.fromkeys(patterns))


class ZeroCopyPlan(FusedPlan):
    name = "zerocopy"

    def __init__(
        self,
        state: TrainState,
        replay: ReplayBuffer,
        config: TrainConfig,
        timer: SectionTimer,
        generator: torch.Generator,
    ) -> None:
        her = replay.her
        if her is not None and not her.goal.capturable:
            raise ValueError("plan 'zerocopy' needs a capturable HER goal reward (this env's calls the host)")
        self.steps_per_call = config.run.steps_per_replay
        self.step_base = torch.zeros((), dtype=torch.int64, device=state.atoms.device)
        super().__init__(state, replay, config, timer, generator)

    def variants(self) -> list[object]:
        return list(flag_patterns(self.config, self.steps_per_call))

    def generators(self) -> list[torch.Generator]:
        return [self.replay.generator, self.generator]

    def body(self, key: object) -> StepOutput:
        assert isinstance(key, tuple)
        output: StepOutput | None = None
        for i, flags in enumerate(key):
            self.replay.sample_into(self.batch, self.step_base + i)
            self.draws.fill_(self.generator)
            output = self.update_body(flags)
        assert output is not None
        return output

    def update(self, batch: Batch, draws: Draws, step: int) -> StepOutput:
        """Not offered: this plan's graphs sample their own batches; compare it through `run`."""
        raise TypeError("plan 'zerocopy' samples inside its graph and takes no batch; compare it through run()")

    def run(self, step: int) -> StepOutput:
        key = tuple(StepFlags.for_step(step + i, self.config) for i in range(self.steps_per_call))
        graph, output = self.graph_for(key)
        with self.timer.section("graph"):
            self.step_base.fill_(step)
            graph.replay()
        return output
