"""matplotlib is only for plots: every trainer module imports, and a training run runs, without it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import trainer
from tests.import_guard import forbid

SCRIPT = forbid("matplotlib", "matplotlib on the training path") + textwrap.dedent(
    """
    import importlib, sys, tempfile
    from pathlib import Path

    root = Path(sys.argv[1])  # every file, namespace folders (trainer/execution/kernels) too
    names = [".".join(p.relative_to(root.parent).with_suffix("").parts) for p in sorted(root.rglob("*.py"))]
    for name in names:
        if not name.endswith("__main__"):  # runs the CLI when imported
            importlib.import_module(name.removesuffix(".__init__"))
    from contracts.config import load_config
    from trainer.runtime.train import run_training
    tiny = ["data.source=gym", "data.env_id=CartPole-v1", "run.steps=2", "run.batch_size=16",
            "replay.capacity=512", "data.learning_starts=64", "model.hidden=32", "model.head_hidden=32",
            "run.cpu_threads=1", "run.eval_episodes=1"]
    with tempfile.TemporaryDirectory() as tmp:
        summary = run_training(load_config(None, tiny), Path(tmp), show_progress=False, out=lambda line: None)
    assert summary["step"] == 2 and "matplotlib" not in sys.modules
    print(len(names))
    """
)


def test_every_trainer_module_imports_and_a_run_trains_without_matplotlib() -> None:
    root = Path(trainer.__path__[0])
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(root)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.strip()) == len(list(root.rglob("*.py"))) > 40
