"""`scripts/pack_recipes.py` end to end on the CPU with tiny settings: a pack of two seeds, a solo run and the
shortened CPU solo, its table and its JSON."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest

import scripts.pack_recipes
from scripts.pack_recipes import main, table
from tests.factories import SMALL_CARTPOLE

TINY = [
    *SMALL_CARTPOLE,
    "model.atoms=11",
    "run.log_every=6",
    "run.checkpoint_every=12",
    "run.eval_every=6",
    "run.eval_select_episodes=1",
    "run.eval_episodes=2",
]


def test_the_pack_and_its_solo_runs_are_trained_tabled_and_written(tmp_path: Path, capsys: object) -> None:
    argv = ["--out", str(tmp_path), "--device", "cpu", "--plan", "eager", "--pack", "2", "--steps", "12"]
    argv += ["--solo-seeds", "1,2", "--cpu-steps", "6", "--threshold", "9", "--max-seconds", "0"]
    for override in TINY:
        argv += ["-o", override]
    document = main(argv)
    assert json.loads((tmp_path / "pack_recipes.json").read_text()) == document
    pack, solo, solo_2, cpu = document["rows"]
    assert pack["row"] == "pack K=2 cpu" and pack["seeds"] == [1, 2] and pack["updates"] == 24
    assert pack["plan"] == "pack-eager" and len(pack["eval_return_mean"]) == 2 and pack["diverged"] == []
    assert pack["reached"] == sum(1 for r in pack["eval_return_mean"] if r >= 9)
    assert solo["row"] == "solo cpu seed 1" and solo["updates"] == 12 and len(solo["eval_return_mean"]) == 1
    assert solo_2["row"] == "solo cpu seed 2" and solo["baseline"] and solo_2["baseline"]
    assert cpu["updates"] == 6 and cpu["eval_return_mean"] == [] and cpu["reached"] is None and "baseline" not in cpu
    for r in document["rows"]:
        assert r["updates_per_s"] == r["updates"] / r["loop_seconds"] > 0 and r["time_limit"] is False
        assert 0 < r["eval_seconds"] < r["loop_seconds"]  # TINY evaluates every few updates
    lines = document["table"].splitlines()
    assert len(lines) == 6 and "| pack K=2 cpu | pack-eager | 24 |" in lines[2]
    # the speed-up is over the solo runs' mean rate, not the first one's
    base = (solo["updates_per_s"] + solo_2["updates_per_s"]) / 2
    for line, r in zip(lines[2:], document["rows"], strict=True):
        assert f"| {r['updates_per_s'] / base:.2f}x |" in line
    assert "(rate only)" in lines[5]
    assert (tmp_path / "runs" / "pack" / "seed-2" / "summary.json").exists()
    assert document["table"] in capsys.readouterr().out  # type: ignore[attr-defined]


def test_a_row_cut_by_its_time_limit_says_so(tmp_path: Path) -> None:
    argv = ["--out", str(tmp_path), "--device", "cpu", "--plan", "eager", "--pack", "2", "--steps", "12"]
    argv += ["--solo-seeds", "", "--cpu-steps", "0", "--max-seconds", "1e-6"]
    for override in TINY:
        argv += ["-o", override]
    (pack,) = main(argv)["rows"]
    assert pack["time_limit"] is True and pack["updates"] == 2
    assert "| pack K=2 cpu | pack-eager | 2 (time limit) |" in table([pack], "475")


def test_the_market_scores_each_seed_by_its_margin_over_the_heuristic(tmp_path: Path) -> None:
    argv = ["--out", str(tmp_path), "--config", "examples/market.yaml", "--device", "cpu", "--plan", "eager"]
    argv += ["--pack", "2", "--steps", "10", "--cpu-steps", "0", "--margin", "-100", "--max-seconds", "0"]
    short = ["run.eval_every=10", "run.eval_select_episodes=1", "run.eval_episodes=2", "data.learning_starts=64"]
    for override in short:
        argv += ["-o", override]
    document = main(argv)
    pack, solo = document["rows"]
    summary = json.loads((tmp_path / "runs" / "pack" / "seed-1" / "summary.json").read_text())
    assert pack["scores"][0] == summary["margin_over_heuristic"] != summary["eval_return_mean"]
    assert pack["reached"] == 2 and solo["reached"] == 1  # every margin is above -100
    assert "| reached margin -100 |" in document["table"] and document["margin"] == -100
    assert f"{summary['margin_over_heuristic']:+.2f}" in document["table"].splitlines()[2]


def test_vary_tunes_in_one_pack_one_row_per_value(tmp_path: Path) -> None:
    argv = ["--out", str(tmp_path), "--device", "cpu", "--plan", "eager", "--pack", "2", "--steps", "6"]
    argv += ["--solo-seeds", "", "--cpu-steps", "0", "--threshold", "9", "--max-seconds", "0"]
    argv += ["--vary", "optim.lr=0.001,0.0001"]
    for override in TINY:
        argv += ["-o", override]
    fast, slow = main(argv)["rows"]
    assert fast["row"] == "pack K=4 cpu optim.lr=0.001" and slow["row"] == "pack K=4 cpu optim.lr=0.0001"
    assert fast["seeds"] == slow["seeds"] == [1, 2] and fast["updates"] == slow["updates"] == 12
    assert fast["loop_seconds"] == slow["loop_seconds"]  # one pack: one training loop
    for value in ("0.001", "0.0001"):
        for seed in (1, 2):
            config = json.loads(
                (tmp_path / "runs" / "pack" / f"optim.lr={value}" / f"seed-{seed}" / "config.json").read_text()
            )
            assert config["optim"]["lr"] == float(value) and config["run"]["seed"] == seed


def test_vary_wants_a_field_and_values(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--vary", "optim.lr"])


def test_inductor_settings_are_held_for_the_rows_and_recorded(tmp_path: Path) -> None:
    from torch._inductor import config as inductor_config

    seen: list[tuple[bool, int]] = []
    argv = ["--out", str(tmp_path), "--device", "cpu", "--plan", "eager", "--pack", "2", "--steps", "2"]
    argv += ["--solo-seeds", "", "--cpu-steps", "0", "--max-seconds", "0"]
    argv += ["--inductor", "combo_kernels=true", "--inductor", "max_fusion_size=3"]  # both in torch 2.11 and 2.13
    for override in TINY:
        argv += ["-o", override]
    real = scripts.pack_recipes.train_pack

    def spy(*args: object) -> object:
        seen.append((inductor_config.combo_kernels, inductor_config.max_fusion_size))
        return real(*args)  # type: ignore[arg-type]

    with mock.patch.object(scripts.pack_recipes, "train_pack", spy):
        document = main(argv)
    assert seen == [(True, 3)]
    assert document["inductor"] == {"combo_kernels": True, "max_fusion_size": 3}
    assert inductor_config.combo_kernels is False  # released after the rows


@pytest.mark.parametrize("item", ["combo_kernels", "no_such_setting=1", "combo_kernels=maybe"])
def test_an_inductor_setting_that_cannot_be_held_is_refused(tmp_path: Path, item: str) -> None:
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--inductor", item])
