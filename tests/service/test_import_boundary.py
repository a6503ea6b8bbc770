"""service/ never imports torch, nor the trainer: every module imports with each made unimportable.
What the controller shares with the trainer lives in the torch-free `contracts` package."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import service
from tests.import_guard import forbid

WALK = textwrap.dedent(
    """
    import importlib, pkgutil, sys

    import service
    names = [m.name for m in pkgutil.walk_packages(service.__path__, "service.")]
    for name in names:
        if not name.startswith("service.migrations."):  # alembic scripts: run below, not imported
            importlib.import_module(name)
    from service.store import Store
    Store("sqlite://").migrate()
    assert "torch" not in sys.modules and "trainer" not in sys.modules
    print(len(names))
    """
)


@pytest.mark.parametrize(
    "package, why",
    [
        ("torch", "torch is not allowed in the controller"),
        ("trainer", "the controller imports contracts, not trainer"),
    ],
)
def test_every_service_module_imports_without(package: str, why: str) -> None:
    expected = len(list(Path(service.__path__[0]).rglob("*.py"))) - 1  # less service/__init__.py
    script = forbid(package, why) + WALK
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.strip()) == expected  # the walk found every module


def test_the_argo_backend_is_imported_only_when_chosen(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from service.app import create_app
        from tests.service.factories import make_settings
        create_app(make_settings(__import__("pathlib").Path({str(tmp_path)!r}), run_reconciler=False))
        assert "service.backends.argo" not in sys.modules and "kubernetes" not in sys.modules
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
