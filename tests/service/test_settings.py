"""Settings come from FOXHUNT_* variables and are built only when asked for."""

from __future__ import annotations

import sys

import pytest
from pydantic import ValidationError

from service.settings import Settings


def test_environment_overrides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOXHUNT_DATABASE_URL", "postgresql://u@db/foxhunt")
    monkeypatch.setenv("FOXHUNT_AUTH_DISABLED", "1")
    monkeypatch.setenv("FOXHUNT_BACKEND", "argo")
    settings = Settings()
    assert settings.database_url == "postgresql+psycopg://u@db/foxhunt"
    assert settings.auth_disabled and settings.backend == "argo"


def test_defaults_run_the_trainer_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FOXHUNT_DATABASE_URL", "FOXHUNT_AUTH_DISABLED", "FOXHUNT_BACKEND", "FOXHUNT_LOCAL_COMMAND"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert settings.database_url == "sqlite:///./foxhunt.db" and settings.backend == "local"
    assert settings.local_command == [sys.executable, "-m", "trainer"] and settings.local_parallel_trials == 1
    assert not settings.auth_disabled


def test_bad_values_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOXHUNT_BACKEND", "slurm")
    with pytest.raises(ValidationError, match="backend"):
        Settings()
