"""The upstream schemas the tests validate against, all from inside the repository's own records.

Argo's CRDs and JSON schema and the Prometheus Operator's CRDs come from the Go modules the cluster is
built from, at the versions in scripts/cluster/versions.env, through `go mod download -json MODULE@VERSION`
(Go's module cache keeps them after the first download). No package ships the Grafana dashboard JSON
schema, so it is vendored in tests/schemas/grafana/ (tests/schemas/README.md records where it came from).

Torch-free and import-cheap: nothing runs until a file is asked for.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ROOT / "scripts" / "cluster" / "versions.env"
VENDORED = Path(__file__).with_name("schemas")

GO_FALLBACK = Path("/usr/local/go/bin/go")
"""Where the official Go tarball installs `go`, tried when it is not on PATH."""
DOWNLOAD_TIMEOUT = 600.0

ARGO = "ARGO"
PROMETHEUS_OPERATOR = "PROMETHEUS_OPERATOR"
MODULES = {
    ARGO: "github.com/argoproj/argo-workflows/v3",
    PROMETHEUS_OPERATOR: "github.com/prometheus-operator/prometheus-operator",
}
"""Go module path of each upstream; its version is `<NAME>_VERSION` in scripts/cluster/versions.env."""

ARGO_CRDS = tuple(
    f"manifests/base/crds/full/argoproj.io_{plural}.yaml"
    for plural in ("workflows", "workflowtemplates", "cronworkflows")
)
ARGO_JSON_SCHEMA = "api/jsonschema/schema.json"
PROMETHEUS_OPERATOR_CRDS = tuple(
    f"example/prometheus-operator-crd/monitoring.coreos.com_{plural}.yaml"
    for plural in ("servicemonitors", "podmonitors", "prometheusrules")
)
GRAFANA_DASHBOARD_SCHEMA = VENDORED / "grafana" / "dashboard.jsonschema.json"


class UpstreamError(RuntimeError):
    """An upstream file cannot be had: Go is missing, the download failed, or the module lacks the file."""


@functools.cache
def versions(path: Path = VERSIONS) -> dict[str, str]:
    """The KEY=VALUE lines of scripts/cluster/versions.env (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise UpstreamError(f"{path}:{number}: not a KEY=VALUE line: {line!r}")
        out[key.strip()] = value.strip()
    return out


def module(name: str) -> tuple[str, str]:
    """(module path, version) of `name` (ARGO, PROMETHEUS_OPERATOR) in scripts/cluster/versions.env."""
    key = f"{name}_VERSION"
    version = versions().get(key)
    if not version:
        raise UpstreamError(f"{VERSIONS} has no {key}")
    return MODULES[name], version


def go_binary() -> str:
    """The `go` command: on PATH, else where Go's tarball installs it."""
    found = shutil.which("go") or (str(GO_FALLBACK) if GO_FALLBACK.is_file() else None)
    if found is None:
        raise UpstreamError(
            "Go is needed to fetch the upstream schemas the tests validate against "
            "(`go mod download -json MODULE@VERSION`, versions in scripts/cluster/versions.env): "
            "install Go (https://go.dev/doc/install) and put `go` on PATH"
        )
    return found


@functools.cache
def module_dir(path: str, version: str) -> Path:
    """The extracted module `path@version` in Go's module cache, downloaded on first use."""
    command = [go_binary(), "mod", "download", "-json", f"{path}@{version}"]
    shown = f"go mod download -json {path}@{version}"
    # Outside any module or workspace, so a go.mod or go.work near the caller changes nothing.
    env = {**os.environ, "GOWORK": "off"}
    try:
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=DOWNLOAD_TIMEOUT,
            cwd=tempfile.gettempdir(),
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise UpstreamError(f"`{shown}` took more than {DOWNLOAD_TIMEOUT:.0f} s") from None
    try:
        info = json.loads(result.stdout)
    except json.JSONDecodeError:
        info = {}
    if result.returncode != 0 or "Error" in info or "Dir" not in info:
        reason = info.get("Error") or result.stderr.strip() or f"exit status {result.returncode}"
        raise UpstreamError(f"`{shown}` failed: {reason}")
    return Path(info["Dir"])


def module_file(name: str, relative: str) -> Path:
    """The file `relative` of module `name` at its version in scripts/cluster/versions.env."""
    path, version = module(name)
    found = module_dir(path, version) / relative
    if not found.is_file():
        raise UpstreamError(f"{relative} is not in {path}@{version} (`go mod download -json {path}@{version}`)")
    return found


def argo_crd_files() -> list[Path]:
    """Argo's full Workflow, WorkflowTemplate and CronWorkflow CRDs."""
    return [module_file(ARGO, relative) for relative in ARGO_CRDS]


def argo_workflow_crd() -> Path:
    """Argo's full Workflow CRD (what the fake API server enforces)."""
    return module_file(ARGO, ARGO_CRDS[0])


def argo_json_schema_file() -> Path:
    """Argo's JSON schema of every API type (api/jsonschema/schema.json)."""
    return module_file(ARGO, ARGO_JSON_SCHEMA)


def prometheus_operator_crd_files() -> list[Path]:
    """The ServiceMonitor, PodMonitor and PrometheusRule CRDs."""
    return [module_file(PROMETHEUS_OPERATOR, relative) for relative in PROMETHEUS_OPERATOR_CRDS]


def prometheus_operator_crd(name: str) -> Path:
    """One Prometheus Operator CRD by its file name (`monitoring.coreos.com_podmonitors.yaml`)."""
    return module_file(PROMETHEUS_OPERATOR, f"example/prometheus-operator-crd/{name}")
