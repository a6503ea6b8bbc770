"""The bench's report: its files where matplotlib is missing."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from trainer.tools.bench import Result
from trainer.tools.bench_report import write_outputs


def test_without_matplotlib_the_outputs_skip_the_plot_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    environment = {"date": "2026-12-03", "torch": "2", "cuda": None, "python": "3.11", "device": "cpu"}
    row = asdict(Result("core", "eager", ms_median=1.0, ms_min=0.9, ms_max=1.1, epoch_s=2.0, speedup=1.0))
    document = {"environment": environment, "options": {}, "results": [row], "timer_overhead": [], "train": []}
    notes: list[str] = []
    paths = write_outputs(document, tmp_path, "python -m trainer bench", log=notes.append)
    assert [path.name for path in paths] == ["bench.json", "bench.md"] and not (tmp_path / "bench.png").exists()
    assert notes == ["no bench.png: matplotlib is not installed (pip install matplotlib to draw it)"]
    assert "(no plot: matplotlib was not installed)" in paths[1].read_text() and "bench.png" not in paths[1].read_text()
