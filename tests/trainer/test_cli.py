"""The trainer CLI on bad input: one line on stderr, exit code 2."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer", "train", *args, "--no-progress"],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.parametrize(
    "setup, args, message",
    [
        (None, ["--config", "missing.yaml"], "error: config file not found: missing.yaml"),
        ("model: [\n", ["--config", "c.yaml"], "error: config file c.yaml is not valid YAML/JSON"),
        ("optim:\n  lr: -3\n", ["--config", "c.yaml"], "error: optim.lr: Input should be greater than 0 (got -3)"),
        (None, ["-o", "run.steps=zero"], "error: run.steps: Input should be a valid integer"),
        (None, ["-o", "data.source=offline", "-o", "data.dataset=none.npz"], "error: "),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, setup: str | None, args: list[str], message: str) -> None:
    if setup is not None:
        (tmp_path / "c.yaml").write_text(setup)
    result = run_cli(*args, "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1, result.stderr


def test_malformed_dataset_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, obs=np.zeros((4, 3), np.float32))  # no action/reward/next_obs/done
    result = run_cli("-o", "data.source=offline", "-o", f"data.dataset={path}", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and str(path) in result.stderr
    assert result.stderr.count("\n") == 1
