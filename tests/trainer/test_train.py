"""The training loop end to end on CPU: outputs, checkpoint round trip, kill-and-resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from tests.factories import tiny_config
from trainer.train import build_run, restore_checkpoint, run_training, save_checkpoint


def test_a_short_run_writes_its_outputs_and_breakdown(tmp_path: Path) -> None:
    lines: list[str] = []
    summary = run_training(tiny_config(), tmp_path, show_progress=False, out=lines.append)
    breakdowns = [line for line in lines if line.startswith("Training step breakdown: sample=")]
    assert len(breakdowns) == 2  # log_every=10 over 20 steps
    assert "fused=" in breakdowns[0] and "guard=" in breakdowns[0] and "(per-step: " in breakdowns[0]
    for component in ("forward_backward", "adam", "attention", "iqn", "causal", "vaccine", "priority"):
        assert f"{component}=" in breakdowns[0]
    for name in ("config.json", "progress.json", "summary.json"):
        assert (tmp_path / name).is_file()
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["step"] == 20 and progress["step_ms"] > 0
    assert summary["step"] == 20 and len(summary["eval_returns"]) == 10
    assert (tmp_path / "checkpoints" / "step-000000020" / "COMPLETE").exists()


def test_checkpoint_round_trip_continues_identically(tmp_path: Path) -> None:
    config = tiny_config()
    original = build_run(config, tmp_path / "a")
    from trainer.train import fill_replay

    fill_replay(original)
    for step in range(5):
        original.plan.run(step)
    original.step = 5
    save_checkpoint(original)

    restored = build_run(config, tmp_path / "b")
    restored.checkpointer = original.checkpointer
    assert restore_checkpoint(restored) and restored.step == 5
    for step in range(5, 9):
        original.plan.run(step)
        restored.plan.run(step)
    for name, tensor in original.state.tensors().items():
        assert torch.equal(tensor, restored.state.tensors()[name]), name


def _write_config(tmp_path: Path, steps: int) -> Path:
    config = tiny_config(run={"steps": steps, "log_every": 5, "checkpoint_every": 20})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


def _train(config: Path, run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", "train", "--config", str(config), "--run-dir", str(run_dir), "--no-progress",
         *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_sigkill_then_resume_finishes_with_the_same_step_count(tmp_path: Path) -> None:
    config, run_dir = _write_config(tmp_path, steps=120), tmp_path / "run"
    process = _train(config, run_dir)
    checkpoints = run_dir / "checkpoints"
    deadline = time.monotonic() + 240
    while not list(checkpoints.glob("step-*/COMPLETE")):
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.05)
    # let it run on past the checkpoint, then kill it without warning
    progress_at_kill = 0
    while progress_at_kill < 45 and process.poll() is None:
        if (run_dir / "progress.json").exists():
            progress_at_kill = json.loads((run_dir / "progress.json").read_text())["step"]
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL

    resumed = _train(config, run_dir, "--resume")
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    resumed_from = int(output.split("resumed from checkpoint at step ")[1].split()[0])
    assert resumed_from >= progress_at_kill - 20  # at most one checkpoint interval lost
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 120


def test_sigterm_writes_a_checkpoint_and_exits_143(tmp_path: Path) -> None:
    config, run_dir = _write_config(tmp_path, steps=100_000), tmp_path / "run"
    process = _train(config, run_dir)
    deadline = time.monotonic() + 240
    while not (run_dir / "progress.json").exists():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 143, output
    step = int(output.split("terminated at step ")[1].split(":")[0])
    assert (run_dir / "checkpoints" / f"step-{step:09d}" / "COMPLETE").exists()
