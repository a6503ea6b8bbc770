"""create_app wiring that the route tests do not reach."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.app import create_app
from service.backends.local import LocalBackend
from tests.service.factories import make_settings


def test_argo_needs_a_pools_file(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, backend="argo", pools_file=None, run_reconciler=False)
    backend = LocalBackend(tmp_path / "jobs", command=["true"], gpus=0)  # any backend: pools are checked first
    with pytest.raises(ValueError, match="FOXHUNT_POOLS_FILE is required with the argo backend"):
        create_app(settings, backend=backend)


def test_the_database_is_migrated_at_start(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, run_reconciler=False))
    assert app.state.services.store.list_jobs() == ([], None)
