"""`trainer bench --isolate` and `--ab` on the CPU at a tiny size: children, sources, the A/B table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.trainer.tools.test_bench import TINY, tiny_options
from trainer.cli import app
from trainer.tools.bench_isolated import REPO, child_command, format_ab_table, resolve_source, run_child, run_isolated
from trainer.tools.bench_report import format_table


def _tree(tmp_path: Path) -> Path:
    """A second source tree: a folder whose trainer/ is this one's."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "trainer").symlink_to(REPO / "trainer")
    return tree


def test_ab_alternates_sources_each_method_in_a_fresh_process(tmp_path: Path) -> None:
    options = tiny_options(configs=["core"], methods=["eager"], timer_overhead=False)
    lines: list[str] = []
    document = run_isolated(options, "cpu", lines.append, sources=[".", str(_tree(tmp_path))], rounds=1)
    rows = document["results"]
    assert [(r["source"], r["round"], r["method"]) for r in rows] == [
        (".", 0, "eager"),
        (str(tmp_path / "tree"), 0, "eager"),
    ]
    assert all(r["error"] is None and r["ms_median"] > 0 and len(r["windows_ms"]) == 2 for r in rows)
    assert sum("fresh process" in line for line in lines) == 2 and any("ms/step" in line for line in lines)
    table = format_table(document)
    assert "A/B (alternating" in table and "eager @. #1" in table


def test_the_ab_table_gives_each_round_and_the_ratio_of_medians() -> None:
    def row(source: str, round_: int, ms: float | None, error: str | None = None) -> dict[str, object]:
        return {"config": "core", "method": "fused", "source": source, "round": round_, "ms_median": ms, "error": error}

    document = {
        "ab": {"sources": ["A", "B"], "rounds": 2},
        "results": [row("A", 0, 2.0), row("B", 0, 1.0), row("A", 1, 2.2), row("B", 1, 1.2)],
    }
    lines = format_ab_table(document).splitlines()
    assert "2.000 2.200" in lines[1] and lines[1].split()[-1] == "2.100"
    assert "1.000 1.200" in lines[2] and lines[2].split()[-2:] == ["1.100", "0.524"]
    failed = {"ab": {"sources": ["A", "B"], "rounds": 1}, "results": [row("A", 0, 2.0), row("B", 0, None, "boom")]}
    assert format_ab_table(failed).splitlines()[2].endswith("failed: boom")


def test_children_get_only_options_every_bench_version_knows(tmp_path: Path) -> None:
    command = child_command(tiny_options(), "core", "zerocopy-bf16", tmp_path, "cuda", timer=False)
    assert command[:4] == [sys.executable, "-m", "trainer", "bench"]
    assert command[command.index("--methods") + 1] == "zerocopy-bf16" and "--no-timer-overhead" in command
    assert command.count("-o") == len(TINY) and "--isolate" not in command and "--train" not in command


def test_a_child_that_fails_is_reported_with_its_last_line(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import sys; print('[core] x', file=sys.stderr); sys.exit('no GPU')"]
    document, why = run_child([*command, "--out", str(tmp_path)], REPO, lambda line: None)
    assert document is None and why == "child exited 1: no GPU"


def test_a_source_that_is_neither_a_tree_nor_a_revision_is_an_error(tmp_path: Path) -> None:
    assert resolve_source(str(_tree(tmp_path)), tmp_path).root == (tmp_path / "tree").resolve()
    with pytest.raises(ValueError, match="--ab 'no-such-revision-xyz'"):
        resolve_source("no-such-revision-xyz", tmp_path)


def test_cli_ab_needs_two_sources() -> None:
    result = CliRunner().invoke(app, ["bench", "--device", "cpu", "--ab", "HEAD"])
    assert result.exit_code == 2 and "--ab takes two sources" in result.output
