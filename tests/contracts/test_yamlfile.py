"""read_yaml: the one reader of the config, space and pools files, and its one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.yamlfile import read_yaml


class Refused(Exception):
    """Stands for a caller's own error type (ConfigError, HyperoptError)."""


def test_a_file_is_parsed_as_yaml_and_json_is_yaml(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("run:\n  steps: 3\n")
    (tmp_path / "b.json").write_text('{"run": {"steps": 3}}')
    assert read_yaml(tmp_path / "a.yaml", "config file") == read_yaml(tmp_path / "b.json", "config file")


def test_a_missing_or_broken_file_raises_the_callers_error_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(Refused, match=r"^space file not found: .*nope\.yaml$"):
        read_yaml(tmp_path / "nope.yaml", "space file", Refused)
    (tmp_path / "bad.yaml").write_text("model: [\n")
    with pytest.raises(ValueError, match=r"^pools file .*bad\.yaml is not valid YAML/JSON: [^\n]+$"):
        read_yaml(tmp_path / "bad.yaml", "pools file")
