"""Seeds trained as one pack (`trainer.runtime.pack_train`): each run's folder holds what `trainer train` writes,
and a run that diverges is frozen and reported while the others train on."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from contracts.config import TrainConfig, load_config
from tests.factories import SMALL_CARTPOLE
from trainer.runtime.pack_train import run_pack_training

CARTPOLE = Path(__file__).resolve().parents[3] / "examples" / "cartpole.yaml"
SMALL = [
    *SMALL_CARTPOLE,
    "model.atoms=11",
    "run.steps=12",
    "run.log_every=6",
    "run.checkpoint_every=6",
    "run.eval_every=6",
    "run.eval_select_episodes=1",
    "run.eval_episodes=1",
    "run.stop_at_return=null",
    "run.plan=eager",
]


def configs(*extra: list[str]) -> list[TrainConfig]:
    return [load_config(CARTPOLE, [*SMALL, f"run.seed={seed}", *more]) for seed, more in enumerate(extra, start=1)]


def train(configs: list[TrainConfig], tmp_path: Path) -> list[dict[str, Any]]:
    dirs = [tmp_path / f"seed-{c.run.seed}" for c in configs]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*batching rule.*")  # CPU attention: vmap loops, same maths
        return run_pack_training(configs, dirs, out=lambda line: None)


def test_each_packed_run_writes_its_own_run_folder(tmp_path: Path) -> None:
    summaries = train(configs([], ["optim.lr=0.001"]), tmp_path)
    for seed, summary in zip((1, 2), summaries, strict=True):
        folder = tmp_path / f"seed-{seed}"
        assert json.loads((folder / "summary.json").read_text()) == summary
        assert summary["step"] == 12 and summary["packed"] is True and summary["diverged_at_step"] is None
        assert len(summary["eval_returns"]) == 1 and summary["best_eval_step"] in (6, 12)
        assert json.loads((folder / "progress.json").read_text())["step"] == 12
        assert json.loads((folder / "config.json").read_text())["run"]["seed"] == seed
        assert any((folder / "checkpoints").iterdir())


def test_a_diverging_run_is_frozen_and_the_others_train_on(tmp_path: Path) -> None:
    """Seed 2's rewards scaled to overflow float32: every loss is non-finite, so its guard skips; it is frozen at
    its first report with its initial network, and seed 1 trains all its updates."""
    summaries = train(configs([], ["loss.reward_scale=1e39"]), tmp_path)
    assert summaries[0]["diverged_at_step"] is None and summaries[0]["guard_skips"] == 0
    assert summaries[1]["diverged_at_step"] == 6 and summaries[1]["step"] == 6
