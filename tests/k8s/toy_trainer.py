"""A small real workload reported through trainer.metrics and trainer.timing, for the Prometheus tests.

Until the training loop serves metrics itself, this stands in for it: each step does real tensor work
under the eager or graphed plans' component names (timed by StepTimer), trains one small regressor
per loss head, keeps a prioritised replay, trips the guard on deliberately poisoned batches and
probes features causally, and reports all of it with the same verbs the loop uses.

Run as a script it serves /metrics until terminated:
    python tests/k8s/toy_trainer.py --plan eager --job-id job-1 --pool pool-a --port 0
and prints `PORT <n>` once the exporter listens.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prometheus_client import CollectorRegistry

from trainer.metrics import LOSS_HEADS, TrainerMetrics, build_info, serve
from trainer.timing import EAGER_COMPONENTS, GRAPH_COMPONENTS, StepTimer

FEATURES = 16
BATCH = 64
CAPACITY = 4096
POISON_EVERY = 97
CAUSAL_EVERY = 20


class ToyTrainer:
    """One regressor per loss head on a synthetic linear task, stepped under a plan's components."""

    def __init__(self, plan: str, metrics: TrainerMetrics, timer: StepTimer, seed: int = 0) -> None:
        self.plan = plan
        self.metrics = metrics
        self.timer = timer
        self.gen = torch.Generator().manual_seed(seed)
        self.true_w = torch.randn(FEATURES, 1, generator=self.gen)
        self.obs = torch.randn(CAPACITY, FEATURES, generator=self.gen)
        self.target = self.obs @ self.true_w + 0.3 * torch.randn(CAPACITY, 1, generator=self.gen)
        self.priority = torch.ones(CAPACITY)
        self.size = BATCH
        self.heads = {head: torch.zeros(FEATURES, 1) for head in LOSS_HEADS}
        self.trunk = torch.randn(FEATURES, 64, generator=self.gen) / 8
        self.lr = 0.05
        self.head_lr = {head: 0.002 * (i + 1) for i, head in enumerate(LOSS_HEADS)}
        self.losses: dict[str, float] = {}
        self.guard_total = 0
        self.step_index = 0

    def _work(self, repeats: int) -> None:
        """Matmuls standing in for a component's kernels (their time is what is measured)."""
        h = self.obs[:BATCH] @ self.trunk
        for _ in range(repeats):
            h = torch.tanh(h @ self.trunk.T @ self.trunk)

    def _update(self, head: str, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        err = x @ self.heads[head] - y  # [B, 1]
        loss = (weight[:, None] * err.pow(2)).mean()
        if torch.isfinite(loss):
            self.heads[head] -= self.head_lr[head] * 2 * x.T @ (weight[:, None] * err) / len(x)
        self.losses[head] = float(loss)
        return err.abs().squeeze(1)

    def step(self) -> None:
        """One timed step; every component name is a real section of the plan."""
        t = self.timer
        self.step_index += 1
        self.losses = {}  # the guard judges this step's losses only
        self.size = min(CAPACITY, self.size + BATCH)
        with t.section("sample"):
            probs = self.priority[: self.size] / self.priority[: self.size].sum()
            index = torch.multinomial(probs, BATCH, replacement=True, generator=self.gen)
            x, y = self.obs[index].clone(), self.target[index]
            weight = (self.size * probs[index]).pow(-0.4)
            weight = weight / weight.max()
        if self.step_index % POISON_EVERY == 0:
            x[0, 0] = float("nan")
        if self.plan == "eager":
            errors = self._eager(x, y, weight)
        else:
            with t.section("graph"):
                self._work(6)
                errors = self._update("c51", x, y, weight)
                self._update("cql", x, y, weight)
            with t.section("aux_stream"):
                for head in ("iqn", "iql", "attention", "ensemble"):
                    self._update(head, x, y, weight)
        with t.section("guard"):
            if not all(torch.isfinite(torch.tensor(v)) for v in self.losses.values()):
                self.guard_total += 1
        errors = torch.nan_to_num(errors, nan=1.0)
        self.priority[index] = errors + 1e-3
        t.end_step()

    def _eager(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        t = self.timer
        with t.section("spectral"):
            self._work(1)
        with t.section("forward_backward"):
            self._work(4)
            errors = self._update("c51", x, y, weight)
            self._update("cql", x, y, weight)
        with t.section("clip_prune"):
            self._work(1)
        with t.section("adam"):
            self._work(2)
        with t.section("ema"):
            self._work(1)
        for head in ("attention", "iql", "iqn", "ensemble"):
            with t.section(head):
                self._update(head, x, y, weight)
                self._work(1)
        if self.step_index % 10 == 0:
            with t.section("vaccine"):
                self._update("vaccine", x + 0.01 * torch.randn_like(x), y, weight)
        if self.step_index % CAUSAL_EVERY == 0:
            with t.section("causal"):
                self.metrics.causal(self.causal_effects(x))
        with t.section("priority"):
            self._work(1)
        return errors

    def causal_effects(self, x: torch.Tensor) -> list[float]:
        """Mean |change of the c51 prediction| when each feature is replaced by a shuffled copy."""
        base = x @ self.heads["c51"]
        effects = []
        for f in range(FEATURES):
            shuffled = x.clone()
            shuffled[:, f] = x[torch.randperm(len(x), generator=self.gen), f]
            effects.append(float(torch.nan_to_num((shuffled @ self.heads["c51"] - base).abs()).mean()))
        return effects

    def report(self) -> None:
        """What the loop reports every log interval."""
        self.metrics.set_losses({h: v for h, v in self.losses.items() if v == v})
        self.metrics.guard_skips(self.guard_total)
        p = self.priority[: self.size]
        self.metrics.replay(self.size, float(p.min()), float(p.mean()), float(p.max()))
        self.metrics.learning_rates({"main": self.lr, "aux": self.lr / 2})


def run_steps(trainer: ToyTrainer, steps: int, epoch_steps: int, pause: float = 0.0) -> None:
    """Step, count, report every 10 steps and close an epoch every `epoch_steps`."""
    epoch_start = time.perf_counter()
    for _ in range(steps):
        trainer.step()
        trainer.metrics.steps_done(1)
        if trainer.step_index % 10 == 0:
            trainer.report()
        if trainer.step_index % epoch_steps == 0:
            now = time.perf_counter()
            trainer.metrics.epoch_done(now - epoch_start)
            epoch_start = now
        if pause:
            time.sleep(pause)


def build(plan: str, job_id: str, pool: str) -> tuple[CollectorRegistry, ToyTrainer]:
    registry = CollectorRegistry()
    env = {**os.environ, "FOXHUNT_JOB_ID": job_id, "FOXHUNT_POOL": pool, "FOXHUNT_COMMIT": "test"}
    info = build_info(plan=plan, model="toy", device="cpu", environ=env)
    metrics = TrainerMetrics(registry, plan=plan, info=info)
    timer = StepTimer(torch.device("cpu"))
    metrics.attach_timer(timer)
    metrics.gpu_memory(torch.device("cpu"))
    return registry, ToyTrainer(plan, metrics, timer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", choices=["eager", "graph"], required=True)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--pool", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--epoch-steps", type=int, default=50)
    parser.add_argument("--pause", type=float, default=0.01, help="seconds between steps (spare the CPU)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    registry, trainer = build(args.plan, args.job_id, args.pool)
    exporter = serve(registry, args.port, addr="127.0.0.1")
    print(f"PORT {exporter.port}", flush=True)
    while True:
        run_steps(trainer, 100, args.epoch_steps, args.pause)


if __name__ == "__main__":
    main()

__all__ = ["EAGER_COMPONENTS", "GRAPH_COMPONENTS", "ToyTrainer", "build", "run_steps"]
