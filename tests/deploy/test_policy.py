"""checkov over the rendered overlays, the Argo templates and the Dockerfile: no failed check, every skip justified."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import ROOT, argo_files

# One checkov run serves every test here (session fixture): under pytest-xdist they share a worker.
pytestmark = pytest.mark.xdist_group("checkov")

FRAMEWORKS = ("kubernetes", "argo_workflows", "dockerfile")


@pytest.fixture(scope="session")
def checkov_reports(rendered_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """One checkov run per session (it is slow), offline, over everything we ship."""
    scan = tmp_path_factory.mktemp("checkov")
    shutil.copytree(rendered_dir, scan / "k8s")
    (scan / "argo").mkdir()
    for path in argo_files():
        shutil.copy(path, scan / "argo" / path.name)
    shutil.copy(ROOT / "Dockerfile", scan / "Dockerfile")
    checkov = Path(sys.executable).parent / "checkov"
    result = subprocess.run(
        [str(checkov), "-d", str(scan), "--framework", *FRAMEWORKS, "--skip-download", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode in (0, 1), result.stderr[-2000:]
    data = json.loads(result.stdout)
    return data if isinstance(data, list) else [data]


def test_every_framework_scanned_something(checkov_reports: list[dict[str, Any]]) -> None:
    scanned = {r["check_type"]: r["summary"]["passed"] + r["summary"]["failed"] for r in checkov_reports}
    assert set(scanned) == set(FRAMEWORKS) and all(scanned.values()), scanned


def test_no_failed_checks(checkov_reports: list[dict[str, Any]]) -> None:
    failed = [
        f"{r['check_type']}: {c['check_id']} {c['resource']} ({c['file_path']})"
        for r in checkov_reports
        for c in r["results"].get("failed_checks", [])
    ]
    assert not failed, "\n".join(failed)


def test_every_skipped_check_says_why(checkov_reports: list[dict[str, Any]]) -> None:
    skipped = [c for r in checkov_reports for c in r["results"].get("skipped_checks", [])]
    assert len(skipped) == sum(r["summary"]["skipped"] for r in checkov_reports)
    for report in checkov_reports:
        for check in report["results"].get("skipped_checks", []):
            reason = (check.get("check_result") or {}).get("suppress_comment", "")
            assert len(reason.split()) >= 5, f"{check['check_id']} on {check['resource']} skipped without a reason"
