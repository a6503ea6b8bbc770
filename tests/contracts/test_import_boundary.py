"""contracts/ is a leaf: its modules import neither torch nor the trainer nor the controller."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import contracts
from tests.import_guard import forbid

SCRIPT = (
    forbid("torch", "contracts must stay torch-free")
    + forbid("trainer", "contracts must not import the trainer")
    + forbid("service", "contracts must not import the controller")
    + textwrap.dedent(
        """
        import importlib, pkgutil

        import contracts
        names = [m.name for m in pkgutil.walk_packages(contracts.__path__, "contracts.")]
        for name in names:
            importlib.import_module(name)
        print(len(names))
        """
    )
)


def test_every_contracts_module_imports_without_torch_trainer_or_service() -> None:
    expected = len(list(Path(contracts.__path__[0]).rglob("*.py"))) - 1  # less contracts/__init__.py
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.strip()) == expected
