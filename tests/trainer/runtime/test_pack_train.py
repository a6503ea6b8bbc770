"""Seeds trained as one pack (`trainer.runtime.pack_train`): each run's folder holds what `trainer train` writes,
and a run that diverges is frozen and reported while the others train on."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from contracts.config import TrainConfig, load_config
from tests.factories import SMALL_CARTPOLE, SMALL_MARKET, FakeClock
from trainer.runtime import pack_train
from trainer.runtime import train as solo_train
from trainer.runtime.pack_train import run_pack_training

CARTPOLE = Path(__file__).resolve().parents[3] / "examples" / "cartpole.yaml"
MARKET = CARTPOLE.with_name("market.yaml")
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
        progress = json.loads((folder / "progress.json").read_text())
        assert progress["step"] == 12
        assert progress["breakdown_ms"]["update"] > 0  # the pack's step, timed once for every run
        assert json.loads((folder / "config.json").read_text())["run"]["seed"] == seed
        assert any((folder / "checkpoints").iterdir())


def test_a_pack_whose_envs_step_in_worker_processes_trains_and_ends_them(tmp_path: Path) -> None:
    """`data.vector_env: process` (each run's envs in a worker of its own): the pack trains, and its workers end
    with it, as a search that trains pack after pack in one process needs."""
    before = set(multiprocessing.active_children())  # another test's, in this process
    summaries = train(configs(["data.vector_env=process"], ["data.vector_env=process"]), tmp_path)
    assert [summary["step"] for summary in summaries] == [12, 12]
    assert set(multiprocessing.active_children()) <= before


@pytest.mark.parametrize("combo", [False, True])
def test_a_compiled_packs_training_takes_the_combined_kernels_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, combo: bool
) -> None:
    """`run.combo_kernels` reaches the pack's compilation (`PACK_COMBO_OPTIONS`). Inductor is not run
    (torch.compile hands back the traced update; the options it is given are read)."""
    given: list[dict[str, Any]] = []

    def spy(fn: Any, **options: Any) -> Any:
        given.append(options)
        return fn

    monkeypatch.setattr(torch, "compile", spy)
    packed = configs(*[["run.plan=compile", f"run.combo_kernels={str(combo).lower()}", "run.steps=2"]] * 2)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*batching rule.*")
        summaries = run_pack_training(packed, [tmp_path / f"seed-{c.run.seed}" for c in packed], out=lambda _: None)
    assert [summary["plan"] for summary in summaries] == ["pack-compile"] * 2
    assert given and all(bool(options["options"].get("combo_kernels")) is combo for options in given)


def test_a_diverging_run_is_frozen_and_the_others_train_on(tmp_path: Path) -> None:
    """Seed 2's rewards scaled to overflow float32: every loss is non-finite, so its guard skips; it is frozen at
    its first report with its initial network, and seed 1 trains all its updates."""
    summaries = train(configs([], ["loss.reward_scale=1e39"]), tmp_path)
    assert summaries[0]["diverged_at_step"] is None and summaries[0]["guard_skips"] == 0
    assert summaries[1]["diverged_at_step"] == 6 and summaries[1]["step"] == 6


class Latest(NamedTuple):
    """A run's last checkpoint: its state's and its replay's tensors."""

    state: dict[str, torch.Tensor]
    replay: dict[str, torch.Tensor]


def packed_beside_solo(packed: list[TrainConfig], tmp_path: Path, same: tuple[str, ...]) -> Iterator[Latest]:
    """`packed` trained as one pack (collection batched), then each run alone (`trainer train`): asserts the
    summaries' `same` keys equal, and yields each run's last checkpoint, packed and solo."""
    from trainer.runtime.checkpoint import Checkpointer
    from trainer.runtime.train import run_training

    lines: list[str] = []
    summaries = run_pack_training(packed, [tmp_path / "pack" / f"seed-{c.run.seed}" for c in packed], out=lines.append)
    assert not [line for line in lines if "collect one by one" in line]
    for config, summary in zip(packed, summaries, strict=True):
        solo_dir = tmp_path / "solo" / f"seed-{config.run.seed}"
        solo = run_training(config, solo_dir, show_progress=False, out=lambda line: None)
        for key in same:
            assert summary[key] == solo[key], key
        mine = Checkpointer(str(tmp_path / "pack" / f"seed-{config.run.seed}" / "checkpoints")).load_latest()
        theirs = Checkpointer(str(solo_dir / "checkpoints")).load_latest()
        assert mine is not None and theirs is not None
        yield Latest(mine.state, mine.replay), Latest(theirs.state, theirs.replay)


def test_a_packed_run_trains_as_its_solo_run(tmp_path: Path) -> None:
    """Two seeds with their own ε schedules, 40 updates as one pack (collection batched across the runs): each run's
    losses, evaluations and final parameters are its solo run's (`trainer train`), bit for bit on the CPU."""
    more = ["run.steps=40", "run.log_every=20", "run.eval_every=20", "run.checkpoint_every=20"]
    packed = configs([*more, "data.epsilon_start=0.5"], [*more, "data.epsilon_start=0.8"])
    same = ("losses", "eval_returns", "best_eval_step", "best_eval_return", "replay_size")
    for mine, theirs in packed_beside_solo(packed, tmp_path, same):
        for name, tensor in {**theirs.state, **theirs.replay}.items():
            assert torch.equal({**mine.state, **mine.replay}[name], tensor), name


@pytest.mark.parametrize("rng", ["torch", "keyed"])
def test_a_packed_market_run_collects_and_evaluates_as_its_solo_run(tmp_path: Path, rng: str) -> None:
    """The torch market (HER and attention on), two seeds as one pack whose markets step as one batch, 20 updates:
    each run's stored rows, evaluations and margin over the heuristic are its solo run's, bit for bit on the CPU;
    its parameters within 1e-4 (relative norm), since with attention on the pack's step is not bit for bit
    (tests/trainer/execution/test_pack.py: `RTOL`) and the priorities it writes back follow its losses."""
    more = ["run.steps=20", "run.log_every=10", "run.eval_every=10", "run.checkpoint_every=10", "run.plan=eager"]
    more += ["run.eval_select_episodes=2", "run.eval_episodes=2"]
    packed = [load_config(MARKET, [*SMALL_MARKET, *more, f"run.seed={seed}", f"run.rng={rng}"]) for seed in (1, 2)]
    same = ("eval_returns", "best_eval_step", "baseline_means", "margin_over_heuristic", "replay_size")
    for mine, theirs in packed_beside_solo(packed, tmp_path, same):
        for name, tensor in theirs.replay.items():
            if name.startswith("storage."):
                assert torch.equal(mine.replay[name], tensor), name
        for name, tensor in theirs.state.items():
            if tensor.is_floating_point():
                error = (mine.state[name] - tensor).norm() / tensor.norm().clamp(min=1e-12)
                assert error <= 1e-4, (name, float(error))
            else:
                assert torch.equal(mine.state[name], tensor), name


def test_a_pack_stops_at_its_time_limit_and_finishes_every_run(tmp_path: Path) -> None:
    """run.max_seconds shorter than one update: the pack stops after its first update and every run finishes as at
    the end (checkpoint, final evaluation, summary saying so)."""
    summaries = train(configs(["run.max_seconds=1e-6"], ["run.max_seconds=1e-6"]), tmp_path)
    for summary in summaries:
        assert summary["step"] == 1 and summary["stopped_by_time_limit"] is True
        assert len(summary["eval_returns"]) == 1 and summary["diverged_at_step"] is None


def test_a_packs_summaries_say_how_much_of_its_loop_was_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clock that moves only while the runs' selection episodes play (2 s each time, at steps 6 and 12): every
    run's loop time is the pack's evaluation time."""
    clock = FakeClock()
    monkeypatch.setattr(pack_train, "time", clock)
    monkeypatch.setattr(solo_train, "time", clock)  # `evaluation_started`'s, which the pack's evaluations start by
    play = pack_train.selection_returns

    def slowly(*args: Any) -> dict[int, float]:
        clock.now += 2.0
        return play(*args)

    monkeypatch.setattr(pack_train, "selection_returns", slowly)
    for summary in train(configs([], []), tmp_path):
        assert summary["eval_seconds"] == summary["wall_seconds"] == 4.0


# ---- resume: a pack goes on from its runs' checkpoints ---------------------------------------------------


def _forget_steps_after(folder: Path, step: int) -> None:
    """A crash after `step`'s checkpoint: later checkpoints and the summary never written."""
    for checkpoint in (folder / "checkpoints").glob("step-*"):
        if int(checkpoint.name.removeprefix("step-")) > step:
            shutil.rmtree(checkpoint)
    (folder / "summary.json").unlink()


def test_a_resumed_pack_trains_on_as_each_run_resumed_alone(tmp_path: Path) -> None:
    """A pack's runs are restored from their step-20 checkpoints (state, replay, generators, best policy) and trained
    to 40: each ends where its solo `trainer train --resume` from the same checkpoint ends, bit for bit on the CPU."""
    from trainer.runtime.checkpoint import Checkpointer
    from trainer.runtime.train import run_training

    more = ["run.steps=40", "run.log_every=20", "run.eval_every=20", "run.checkpoint_every=20"]
    packed = configs(more, [*more, "optim.lr=0.001"])
    dirs = [tmp_path / "pack" / f"seed-{c.run.seed}" for c in packed]
    run_pack_training(packed, dirs, out=lambda line: None)
    for folder in dirs:
        _forget_steps_after(folder, 20)
        shutil.copytree(folder / "checkpoints", tmp_path / "solo" / folder.name / "checkpoints")
    lines: list[str] = []
    summaries = run_pack_training(packed, dirs, out=lines.append, resume=True)
    assert "resumed from checkpoint at step 20" in lines
    for config, folder, summary in zip(packed, dirs, summaries, strict=True):
        solo_dir = tmp_path / "solo" / folder.name
        solo = run_training(config, solo_dir, resume=True, show_progress=False, out=lambda line: None)
        assert summary["step"] == solo["step"] == 40
        for key in ("losses", "eval_returns", "best_eval_step", "best_eval_return", "replay_size"):
            assert summary[key] == solo[key], key
        mine = Checkpointer(str(folder / "checkpoints")).load(40)
        theirs = Checkpointer(str(solo_dir / "checkpoints")).load(40)
        for name, tensor in theirs.state.items():
            assert torch.equal(mine.state[name], tensor), name


def test_a_run_that_diverged_before_the_restart_stays_frozen(tmp_path: Path) -> None:
    """Seed 2 froze at step 6, between checkpoints (every 4); the pack crashes at its last report, before its final
    checkpoints (seed 1's last at 8), and resumes: seed 2 is restored frozen at 6 from the checkpoint written when
    it froze, seed 1 goes on from 8 to 12."""

    class Crash(Exception):
        pass

    def crash_at_the_end(report: dict[str, Any]) -> None:
        if report["step"] == 12:
            raise Crash

    packed = configs(["run.checkpoint_every=4"], ["loss.reward_scale=1e39", "run.checkpoint_every=4"])
    dirs = [tmp_path / f"seed-{c.run.seed}" for c in packed]
    with pytest.raises(Crash):
        run_pack_training(packed, dirs, out=lambda line: None, on_report=crash_at_the_end)
    lines: list[str] = []
    summaries = run_pack_training(packed, dirs, out=lines.append, resume=True)
    assert "resumed from checkpoint at step 8" in lines
    assert "[run 1 seed 2] diverged at step 6 before the restart: stays frozen" in lines
    assert (summaries[0]["step"], summaries[0]["diverged_at_step"]) == (12, None)
    assert (summaries[1]["step"], summaries[1]["diverged_at_step"]) == (6, 6)


def test_resume_without_a_step_every_running_run_completed_starts_at_step_0(tmp_path: Path) -> None:
    packed = configs([], [])
    dirs = [tmp_path / f"seed-{c.run.seed}" for c in packed]
    run_pack_training(packed, dirs, out=lambda line: None)
    shutil.rmtree(dirs[1] / "checkpoints")  # seed 2's checkpoints lost: the pack cannot go on from one step
    lines: list[str] = []
    summaries = run_pack_training(packed, dirs, out=lines.append, resume=True)
    assert "--resume: no checkpoint common to the pack's runs; starting at step 0" in lines
    assert [summary["step"] for summary in summaries] == [12, 12]


def test_sigterm_checkpoints_every_run_and_resume_goes_on_from_there(tmp_path: Path) -> None:
    """`trainer train-pack` as a pod runs it: SIGTERM (an eviction) writes both runs' checkpoints at the step it
    stopped at and exits 143; `--resume` then trains on from that step."""
    command = [sys.executable, "-m", "trainer", "train-pack", "--config", str(CARTPOLE), "--seeds", "1,2"]
    overrides = [arg for item in [*SMALL, "run.log_every=2", "run.checkpoint_every=1000"] for arg in ("-o", item)]
    out = tmp_path / "pack"
    first = subprocess.Popen(
        [*command, "--out", str(out), *overrides, "-o", "run.steps=100000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    progress = out / "seed-1" / "progress.json"
    deadline = time.monotonic() + 240
    while not (progress.exists() and json.loads(progress.read_text())["step"] >= 4):
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.stderr else ""
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 143, stderr
    stopped = int(stderr.split("terminated at step ")[1].split(":")[0])
    from trainer.runtime.checkpoint import Checkpointer

    assert [Checkpointer(str(out / f"seed-{seed}" / "checkpoints")).complete_steps() for seed in (1, 2)] == [
        [stopped],
        [stopped],
    ]
    resumed = subprocess.run(
        [*command, "--out", str(out), *overrides, "-o", f"run.steps={stopped + 4}", "--resume"],
        capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from checkpoint at step {stopped}" in resumed.stderr
    assert [json.loads((out / f"seed-{s}" / "summary.json").read_text())["step"] for s in (1, 2)] == [stopped + 4] * 2
