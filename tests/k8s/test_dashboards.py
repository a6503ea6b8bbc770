"""The committed dashboard JSON is what scripts/dashboards.py renders (`make dashboards` regenerates it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.dashboards import INFO_JOIN, main, render
from tests.k8s.conftest import DASHBOARDS


def test_committed_dashboards_are_what_the_code_renders() -> None:
    rendered = render()
    assert sorted(rendered) == sorted(path.name for path in DASHBOARDS), (
        "a dashboard file without code, or code without a file"
    )
    stale = [path.name for path in DASHBOARDS if path.read_text() != rendered[path.name]]
    assert not stale, f"{stale} differ from scripts/dashboards.py: run `make dashboards` and commit the result"


def test_the_check_mode_fails_on_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("scripts.dashboards.OUT", tmp_path)
    assert main([]) == 0  # writes every file
    assert main(["--check"]) == 0
    (name, text), *_ = render().items()
    (tmp_path / name).write_text(text.replace('"foxhunt"', '"edited by hand"', 1))
    assert main(["--check"]) == 1
    assert (tmp_path / name).read_text() != text  # --check writes nothing


def test_every_trainer_query_joins_the_info_series_for_its_labels() -> None:
    """Pool and Job filter a panel only through the join: every foxhunt_train_* query must carry it."""
    for text in render().values():
        for panel in json.loads(text)["panels"]:
            for target in panel["targets"]:
                if "foxhunt_train_" in target["expr"]:
                    assert f"{INFO_JOIN}{{" in target["expr"], panel["title"]
