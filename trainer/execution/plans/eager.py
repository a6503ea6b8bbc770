"""The baseline plan: `train_step` as plain PyTorch, one kernel launch at a time.

Like most trainers it reads the losses back to the host every step, so each step ends in a sync.
Every component is timed by name (`StepTimer` sections), which is what the breakdown line prints.
Float32 unless `run.precision` says otherwise (tf32; bf16: autocast in the step, TF32 for the rest).
"""

from __future__ import annotations

from trainer.algo.step import StepFlags, StepOutput, train_step
from trainer.execution.plans._capture import matmul_precision
from trainer.execution.plans.base import BasePlan


class EagerPlan(BasePlan):
    name = "eager"
    read_losses = True
    """Read the losses back to the host every step (a sync), as trainers do."""

    def run(self, step: int) -> StepOutput:
        self.sample(step)
        with matmul_precision(self.tf32):
            output = self.train(StepFlags.for_step(step, self.config))
        with self.timer.section("priority"):
            self.replay.update_priorities(self.batch.index, output.priority)
        if self.read_losses:
            self.last_losses = {name: float(value) for name, value in output.losses.items()}
        return output

    def train(self, flags: StepFlags) -> StepOutput:
        """The update over this step's batch and draws, its parts timed by name."""
        return train_step(self.state, self.batch, self.draws, self.hp, flags, self.timer)
