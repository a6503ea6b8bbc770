"""The compiler's own baseline: the eager plan with `train_step` under torch.compile.

Inductor kernels in torch.compile's own CUDA graphs ("reduce-overhead", the best mode that runs), over
static batch and state buffers, no per-step read-back. Sampling and draws stay eager. It runs on the
CPU too (Inductor's C++ kernels), which is how the tests check it against eager.
"""

from __future__ import annotations

import torch

from trainer.algo.step import StepFlags, StepOutput, train_step
from trainer.execution.plans.eager import EagerPlan


class CompiledEagerPlan(EagerPlan):
    name = "compile"
    read_losses = False

    def build(self) -> None:
        state = self.state
        static = [*state.tensors().values(), *vars(self.batch).values(), *vars(self.draws).values(), state.atoms]
        for tensor in static:
            if isinstance(tensor, torch.Tensor):  # Draws also holds a flag
                torch._dynamo.mark_static_address(tensor)
        self.compiled = torch.compile(train_step, mode="reduce-overhead")

    def train(self, flags: StepFlags) -> StepOutput:
        with self.timer.section("compiled"):  # one span: the timer stays outside the compiled code
            return self.compiled(self.state, self.batch, self.draws, self.hp, flags)
