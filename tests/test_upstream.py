"""tests/upstream.py: versions from one file, schemas from Go's module cache, clear errors when Go fails."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from tests import upstream


def test_every_upstream_has_one_version_in_cluster_versions_env() -> None:
    table = upstream.versions()
    for name in upstream.MODULES:
        path, version = upstream.module(name)
        assert version == table[f"{name}_VERSION"] and version.startswith("v"), (name, version)
        assert path == upstream.MODULES[name]


def test_the_schema_files_are_in_the_modules_at_those_versions() -> None:
    files = [
        *upstream.argo_crd_files(),
        upstream.argo_json_schema_file(),
        *upstream.prometheus_operator_crd_files(),
    ]
    for path in files:
        assert path.is_file() and path.stat().st_size > 10_000, path
    argo, version = upstream.module(upstream.ARGO)
    assert f"{argo}@{version}" in str(upstream.argo_workflow_crd())


def test_the_vendored_grafana_schema_is_the_recorded_upstream_file() -> None:
    digest = hashlib.sha256(upstream.GRAFANA_DASHBOARD_SCHEMA.read_bytes()).hexdigest()
    readme = (upstream.VENDORED / "README.md").read_text()
    assert digest in readme, "tests/schemas/grafana/dashboard.jsonschema.json differs from the README's SHA-256"
    assert (upstream.GRAFANA_DASHBOARD_SCHEMA.parent / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_a_missing_go_is_reported_with_the_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(upstream.shutil, "which", lambda name: None)
    monkeypatch.setattr(upstream, "GO_FALLBACK", tmp_path / "no-go")
    with pytest.raises(upstream.UpstreamError, match=r"Go is needed .*`go mod download -json MODULE@VERSION`"):
        upstream.go_binary()


def test_a_failed_download_names_the_command_and_gos_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    go = tmp_path / "go"
    go.write_text('#!/bin/sh\necho \'{"Path": "example.com/m", "Error": "not found: 410 Gone"}\'\nexit 1\n')
    go.chmod(0o755)
    monkeypatch.setattr(upstream, "go_binary", lambda: str(go))
    with pytest.raises(upstream.UpstreamError, match=r"`go mod download -json example.com/m@v9.9.9` failed: not found"):
        upstream.module_dir("example.com/m", "v9.9.9")


def test_a_file_missing_from_the_module_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(upstream, "module_dir", lambda path, version: tmp_path)
    with pytest.raises(upstream.UpstreamError, match=r"api/none.json is not in github.com/argoproj/argo-workflows/v3@"):
        upstream.module_file(upstream.ARGO, "api/none.json")


def test_versions_env_is_plain_shell() -> None:
    """scripts/cluster/versions.env sources in a shell to the same values Python reads."""
    keys = " ".join(f"${key}" for key in upstream.versions())
    shell = subprocess.run(
        ["sh", "-c", f'. "{upstream.VERSIONS}" && echo {keys}'], capture_output=True, text=True, check=True
    )
    assert shell.stdout.split() == list(upstream.versions().values())
