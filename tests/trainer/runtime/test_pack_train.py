"""Seeds trained as one pack (`trainer.runtime.pack_train`): each run's folder holds what `trainer train` writes,
and a run that diverges is frozen and reported while the others train on."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

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


def test_a_packed_run_trains_as_its_solo_run(tmp_path: Path) -> None:
    """Two seeds with their own ε schedules, 40 updates as one pack (collection batched across the runs): each run's
    losses, evaluations and final parameters are its solo run's (`trainer train`), bit for bit on the CPU."""
    from trainer.runtime.checkpoint import Checkpointer
    from trainer.runtime.train import run_training

    more = ["run.steps=40", "run.log_every=20", "run.eval_every=20", "run.checkpoint_every=20"]
    packed = configs([*more, "data.epsilon_start=0.5"], [*more, "data.epsilon_start=0.8"])
    lines: list[str] = []
    dirs = [tmp_path / "pack" / f"seed-{c.run.seed}" for c in packed]
    summaries = run_pack_training(packed, dirs, out=lines.append)
    assert not [line for line in lines if "collect one by one" in line]
    for config, summary in zip(packed, summaries, strict=True):
        solo_dir = tmp_path / "solo" / f"seed-{config.run.seed}"
        solo = run_training(config, solo_dir, show_progress=False, out=lambda line: None)
        for key in ("losses", "eval_returns", "best_eval_step", "best_eval_return", "replay_size"):
            assert summary[key] == solo[key], key
        mine = Checkpointer(str(tmp_path / "pack" / f"seed-{config.run.seed}" / "checkpoints")).load_latest()
        theirs = Checkpointer(str(solo_dir / "checkpoints")).load_latest()
        assert mine is not None and theirs is not None
        for name, tensor in theirs.state.items():
            assert torch.equal(mine.state[name], tensor), name
        for name, tensor in theirs.replay.items():
            assert torch.equal(mine.replay[name], tensor), name


def test_a_pack_stops_at_its_time_limit_and_finishes_every_run(tmp_path: Path) -> None:
    """run.max_seconds shorter than one update: the pack stops after its first update and every run finishes as at
    the end (checkpoint, final evaluation, summary saying so)."""
    summaries = train(configs(["run.max_seconds=1e-6"], ["run.max_seconds=1e-6"]), tmp_path)
    for summary in summaries:
        assert summary["step"] == 1 and summary["stopped_by_time_limit"] is True
        assert len(summary["eval_returns"]) == 1 and summary["diverged_at_step"] is None
