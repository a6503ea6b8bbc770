"""Learning, not just running: the trainer solves CartPole, beats the heuristic on the market, and learns offline.

These run real training on the CPU; the budgets and seeds are the ones in docs/results.md.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from contracts.config import load_config
from trainer.execution.data.gym_source import GymSource
from trainer.execution.data.offline import collect_dataset, write_dataset
from trainer.runtime.train import run_training

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def random_policy_returns(source, episodes: int, seed: int) -> list[float]:
    generator = torch.Generator().manual_seed(seed)
    spec = source.spec

    def act(obs: torch.Tensor) -> torch.Tensor:
        return torch.randint(0, spec.actions, (obs.shape[0], spec.branches), generator=generator)

    return source.evaluate(act, episodes, seed)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_cartpole_is_solved(tmp_path: Path) -> None:
    """C51 + CQL + IQN reach a mean return >= 475 over 20 greedy episodes within examples/cartpole.yaml's
    budget, stopping once a selection evaluation scores 500 (run.stop_at_return).

    Seed 1: on the development machine its greedy policy first scores 500 at update 6,000 (since the C51
    projection became a broadcast sum, 2026-12-04; seed 4, the seed before, now at 20,000), so the test
    takes about 2 minutes instead of the 30,000 updates' 10. Float rounding differs between CPU models,
    so elsewhere the run may go on longer, up to the whole budget, within which seeds 1-8 all solve it
    (docs/results.md)."""
    config = load_config(EXAMPLES / "cartpole.yaml", ["run.seed=1"])
    summary = run_training(config, tmp_path, show_progress=False, out=lambda line: None)
    assert len(summary["eval_returns"]) == 20
    assert summary["eval_return_mean"] >= 475, summary["eval_returns"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_market_beats_the_signal_following_heuristic_and_a_random_policy(tmp_path: Path) -> None:
    """examples/market.yaml: the greedy policy beats the heuristic by >= 1.0 per episode, and random,
    on the final evaluation's 50 episodes, which both baselines play too (the summary's baselines)."""
    config = load_config(EXAMPLES / "market.yaml")
    summary = run_training(config, tmp_path, show_progress=False, out=lambda line: None)
    means = summary["baseline_means"]
    assert len(summary["eval_returns"]) == 50
    assert summary["margin_over_heuristic"] >= 1.0, (summary["eval_return_mean"], means)
    assert summary["eval_return_mean"] >= means["random"] + 3.0, (summary["eval_return_mean"], means)


@pytest.mark.slow
def test_offline_training_beats_the_policy_that_collected_the_data(tmp_path: Path) -> None:
    """A dataset from a uniformly random CartPole policy; C51 + CQL trained on it alone does better."""
    source = GymSource("CartPole-v1", num_envs=4, seed=3, device="cpu")
    rows = collect_dataset(source, steps=5000, greedy_fn=None, epsilon=1.0, generator=torch.Generator().manual_seed(3))
    path = str(tmp_path / "random-cartpole.parquet")
    write_dataset(path, rows, num_actions=2, env_id="CartPole-v1")
    behaviour_mean = float(np.mean(random_policy_returns(source, 20, 20_000)))

    config = load_config(EXAMPLES / "offline-cartpole.yaml", [f"data.dataset={path}"])
    summary = run_training(config, tmp_path / "run", show_progress=False, out=lambda line: None)
    assert summary["eval_return_mean"] >= 2 * behaviour_mean, (summary["eval_return_mean"], behaviour_mean)
