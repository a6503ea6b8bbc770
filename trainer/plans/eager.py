"""The baseline plan: `train_step` as plain PyTorch, one kernel launch at a time.

Like most trainers it reads the losses back to the host every step, so each step ends in a sync.
Every component is timed by name (`StepTimer` sections), which is what the breakdown line prints.
"""

from __future__ import annotations

import torch

from trainer.config import TrainConfig
from trainer.replay.buffer import ReplayBuffer
from trainer.state import TrainState
from trainer.step import Draws, Hyper, SectionTimer, StepFlags, StepOutput, train_step


class EagerPlan:
    name = "eager"
    steps_per_call = 1

    def __init__(
        self,
        state: TrainState,
        replay: ReplayBuffer,
        config: TrainConfig,
        timer: SectionTimer,
        generator: torch.Generator,
    ) -> None:
        self.state, self.replay, self.config, self.timer, self.generator = state, replay, config, timer, generator
        self.hp = Hyper.from_config(config)
        self.draws = Draws.empty(state.dims, config.run.batch_size, state.atoms.device)
        self.last_losses: dict[str, float] = {}

    def run(self, step: int) -> StepOutput:
        with self.timer.section("sample"):
            batch = self.replay.sample(self.config.run.batch_size, step)
            self.draws.fill_(self.generator)
        output = train_step(
            self.state, batch, self.draws, self.hp, StepFlags.for_step(step, self.config), self.timer
        )
        with self.timer.section("priority"):
            self.replay.update_priorities(batch.index, output.priority)
        self.last_losses = {name: float(value) for name, value in output.losses.items()}
        return output
