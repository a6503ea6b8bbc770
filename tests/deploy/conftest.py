"""Shared fixtures for the deployment tests: rendered overlays, the upstream schemas (tests/upstream.py), checkov."""

from __future__ import annotations

import json
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import upstream
from tests.system_packages import ensure_debian_packages

ROOT = Path(__file__).resolve().parents[2]
ARGO_DIR = ROOT / "argo"
K8S_DIR = ROOT / "k8s"
OVERLAYS = ("dev", "h100")
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

Doc = dict[str, Any]


def load_docs(path: Path) -> list[Doc]:
    """Every non-empty YAML document in a file."""
    return [doc for doc in yaml.load_all(path.read_text(), Loader=Loader) if doc]


def argo_files() -> list[Path]:
    """The Argo objects we ship (the Kustomize files beside them are not Argo objects)."""
    return sorted(p for p in ARGO_DIR.glob("*.yaml") if not p.name.startswith("kustomiz"))


def argo_doc(name: str) -> Doc:
    """The Argo object named `name` in argo/."""
    for path in argo_files():
        for doc in load_docs(path):
            if doc["metadata"]["name"] == name:
                return doc
    raise LookupError(f"no Argo object named {name} in {ARGO_DIR}")


def _strip_missing_components(overlay_dir: Path) -> list[str]:
    """Drop `components:` entries that do not exist yet; return what was dropped."""
    path = overlay_dir / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    present, missing = [], []
    for entry in kustomization.get("components", []):
        (present if (overlay_dir / entry / "kustomization.yaml").is_file() else missing).append(entry)
    if missing:
        kustomization["components"] = present
        path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return missing


@pytest.fixture(scope="session")
def kubectl() -> str:
    return ensure_debian_packages("kubectl", "kubernetes-client")


@pytest.fixture(scope="session")
def rendered(kubectl: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Doc]]:
    """`kubectl kustomize k8s/overlays/<name>` for each overlay, parsed.

    Components another part of the project owns (k8s/components/monitoring) may not exist yet; the
    overlays are rendered from a copy without them, with a warning naming what was left out.
    """
    work = tmp_path_factory.mktemp("render")
    shutil.copytree(K8S_DIR, work / "k8s")
    shutil.copytree(ARGO_DIR, work / "argo")
    out: dict[str, list[Doc]] = {}
    for name in OVERLAYS:
        overlay = work / "k8s" / "overlays" / name
        missing = _strip_missing_components(overlay)
        if missing:
            warnings.warn(f"overlay {name}: rendered without missing components {missing}", stacklevel=1)
        result = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"kubectl kustomize {name} failed: {result.stderr.strip()}"
        out[name] = [doc for doc in yaml.load_all(result.stdout, Loader=Loader) if doc]
        (work / f"{name}.yaml").write_text(result.stdout)
    return out


@pytest.fixture(scope="session")
def rendered_dir(rendered: dict[str, list[Doc]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rendered overlays as files (one per overlay), for tools that scan a directory."""
    out = tmp_path_factory.mktemp("rendered")
    for name, docs in rendered.items():
        (out / f"{name}.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return out


@pytest.fixture(scope="session")
def argo_json_schema() -> Doc:
    """Argo's JSON schema of every API type, from the Argo module in cluster/versions.env."""
    return json.loads(upstream.argo_json_schema_file().read_text())


def crd_schemas(paths: list[Path]) -> dict[tuple[str, str], Doc]:
    """(apiVersion, kind) -> openAPIV3Schema of each CRD file."""
    out: dict[tuple[str, str], Doc] = {}
    for path in paths:
        crd = yaml.load(path.read_text(), Loader=Loader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            out[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return out


@pytest.fixture(scope="session")
def argo_crds() -> dict[tuple[str, str], Doc]:
    """Argo's Workflow, WorkflowTemplate and CronWorkflow CRDs, from the Argo module in cluster/versions.env."""
    return crd_schemas(upstream.argo_crd_files())


@pytest.fixture(scope="session")
def prometheus_crds() -> dict[tuple[str, str], Doc]:
    """The Prometheus Operator's monitor and rule CRDs, from its module in cluster/versions.env."""
    return crd_schemas(upstream.prometheus_operator_crd_files())
