"""The benchmark harness on CPU at a tiny size: presets, replay fill, timing loop, table and files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.factories import SMALL_CARTPOLE, SMALL_MODEL
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.cli import app
from trainer.runtime.timing import COLLECT_COMPONENTS
from trainer.tools.bench import (
    PRESETS,
    BenchOptions,
    bench_spec,
    check_options,
    fill_with_random_transitions,
    preset_config,
    run_bench,
)
from trainer.tools.bench_report import format_table, write_outputs

TINY = [*SMALL_MODEL, "model.atoms=5"]


def tiny_options(**changes: object) -> BenchOptions:
    options = BenchOptions(
        batch_size=4, capacity=256, obs_dim=16, steps=2, repeats=2, warmup=1, steps_per_replay=1, overrides=TINY
    )
    for key, value in changes.items():
        setattr(options, key, value)
    return options


def test_core_and_full_switch_the_optional_parts() -> None:
    core, full = preset_config("core", tiny_options()), preset_config("full", tiny_options())
    assert (core.model.ensemble_heads, core.loss.vaccine, core.loss.causal, core.replay.her) == (0, False, False, False)
    assert full.model.ensemble_heads > 0 and full.loss.vaccine and full.loss.causal and full.replay.her
    assert bench_spec(core).goal is None and bench_spec(full).goal is not None


def test_pinned_defaults_are_the_issue_model() -> None:
    config = preset_config("core", BenchOptions())
    assert (config.run.batch_size, config.replay.capacity, config.data.market_features) == (1024, 1_000_000, 64)
    assert (config.model.atoms, bench_spec(config).branches, bench_spec(config).actions) == (51, 3, 5)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"configs": ["huge"]}, "unknown bench names huge"),
        ({"methods": ["warp"]}, "unknown bench names warp"),
        ({"methods": ["zerocopy-fp16"]}, "unknown bench names zerocopy-fp16"),
        ({"steps": 0}, "must be positive"),
        ({"steps": 5, "steps_per_replay": 2}, "multiple of steps_per_replay"),
        ({"pack": [0]}, "pack sizes must be 1 to 64"),
        ({"pack": [2], "pack_methods": ["zerocopy"]}, "a pack runs as eager or graph"),
        ({"pack": [2], "pack_methods": ["zerocopy+combo"]}, "a pack runs as eager or graph"),
    ],
)
def test_bad_options_are_one_line_errors(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_options(tiny_options(**changes))


def test_a_precision_suffix_sets_the_methods_run_precision() -> None:
    from trainer.tools.bench import METHODS, method_config, split_method

    assert {"compile", "compile-bf16", "zerocopy", "zerocopy-bf16"} <= set(METHODS)
    assert split_method("zerocopy-bf16") == ("zerocopy", "bf16") and split_method("compile") == ("compile", None)
    config = preset_config("core", tiny_options())
    assert method_config(config, "compile-bf16").run.precision == "bf16"
    assert method_config(config, "compile") is config and config.run.precision == "auto"
    with pytest.raises(ValueError, match="unknown bench method 'compile-half'"):
        split_method("compile-half")


def test_compile_bf16_is_the_compiled_eager_step_with_tf32_and_bf16_autocast() -> None:
    from trainer.algo.model import ModelDims
    from trainer.algo.state import TrainState
    from trainer.algo.step import NO_TIMER
    from trainer.execution.plans.compiled import CompiledEagerPlan
    from trainer.tools.bench import method_plan

    config = preset_config("core", tiny_options())
    replay = ReplayBuffer(config, bench_spec(config), "cpu", torch.Generator().manual_seed(1))
    spec = replay.spec
    state = TrainState.create(config, ModelDims.build(config.model, spec.obs_dim, spec.branches, spec.actions), "cpu")
    plan_type, bf16 = method_plan("compile-bf16", config)
    plan = plan_type(state, replay, bf16, NO_TIMER, torch.Generator().manual_seed(2))
    assert isinstance(plan, CompiledEagerPlan) and plan.tf32 and plan.hp.autocast is torch.bfloat16
    plain_type, plain_config = method_plan("compile", config)
    plain = plain_type(state, replay, plain_config, NO_TIMER, torch.Generator().manual_seed(2))
    assert not plain.tf32 and plain.hp.autocast is None  # type: ignore[attr-defined]


def test_run_bench_times_a_bf16_variant_beside_its_method() -> None:
    options = tiny_options(configs=["core"], methods=["eager", "eager-bf16"], timer_overhead=False)
    document = run_bench(options, torch.device("cpu"), log=lambda line: None)
    rows = {r["method"]: r for r in document["results"]}
    assert rows["eager-bf16"]["error"] is None and rows["eager-bf16"]["ms_median"] > 0
    assert rows["eager-bf16"]["losses"] != rows["eager"]["losses"]  # other arithmetic, same batches
    assert "eager-bf16" in format_table(document)


def test_pack_rows_time_k_runs_as_one_beside_the_solo_method() -> None:
    """`--pack 1,2`: each row carries K and its aggregate speed-up over the solo row, timed in the same run (here
    timed for the packs, as --methods did not name it)."""
    options = tiny_options(configs=["core"], methods=["eager"], timer_overhead=False, pack=[1, 2])
    options.pack_methods = ["eager-bf16"]
    document = run_bench(options, torch.device("cpu"), log=lambda line: None)
    solo = next(r for r in document["results"] if r["method"] == "eager-bf16")
    rows = document["pack"]
    assert [(r["method"], r["pack"], r["error"]) for r in rows] == [("eager-bf16", 1, None), ("eager-bf16", 2, None)]
    for row in rows:
        assert row["solo_ms"] == solo["ms_median"]
        assert row["updates_per_s"] == pytest.approx(row["pack"] * 1e3 / row["ms_median"])
        assert row["aggregate_speedup"] == pytest.approx(row["updates_per_s"] * solo["ms_median"] / 1e3)
    assert "aggregate" in format_table(document)


def test_fill_with_random_transitions_writes_distinct_whole_episodes() -> None:
    # core: the full preset's extra parts (vaccine, causal, ensemble, HER) compile in the GPU equivalence
    # tests of the fused plan; here they would double a cold CPU compilation
    config = preset_config("core", tiny_options())
    replay = ReplayBuffer(config, bench_spec(config), "cpu", torch.Generator().manual_seed(0))
    fill_with_random_transitions(replay, 256, seed=0, chunk=100)
    assert len(replay) == 256
    assert replay.storage.obs.std() > 0.5  # random rows, not zeros
    assert torch.unique(replay.storage.obs[:, 0]).numel() == 256
    assert int(replay.storage.episode_len.max()) == 200 and int(replay.storage.episode_step.max()) == 199


def test_run_bench_times_methods_and_timer_overhead(tmp_path: Path) -> None:
    options = tiny_options(methods=["eager", "graph"])
    document = run_bench(options, torch.device("cpu"), log=lambda line: None)
    all_results = document["results"]
    assert [(r["config"], r["method"]) for r in all_results] == [(c, m) for c in PRESETS for m in ("eager", "graph")]
    # a GPU plan on the CPU is reported as not run, never timed as the eager fallback under its name
    skipped = [r for r in all_results if r["method"] == "graph"]
    assert all(r["error"].startswith("not run: plan 'graph' needs a CUDA GPU") for r in skipped)
    assert all(r["ms_median"] is None for r in skipped)
    results = [r for r in all_results if r["method"] == "eager"]
    for result in results:
        assert result["error"] is None
        assert len(result["windows_ms"]) == 2 and result["ms_min"] <= result["ms_median"] <= result["ms_max"]
        assert result["epoch_s"] == pytest.approx(result["ms_median"] * 2.0)
        assert all(value == value for value in result["losses"].values())  # finite losses were read back
    assert results[0]["speedup"] == pytest.approx(1.0)
    assert [(row["config"], row["method"]) for row in document["timer_overhead"]] == [("core", "eager")]


def test_the_timer_overhead_is_measured_for_each_variant_of_eager_and_zerocopy() -> None:
    """The fastest plan is a zerocopy variant (zerocopy-bf16+combo): its overhead is the one that counts."""
    options = tiny_options(configs=["core"], methods=["eager-bf16"])
    document = run_bench(options, torch.device("cpu"), log=lambda line: None)
    assert [(row["config"], row["method"]) for row in document["timer_overhead"]] == [("core", "eager-bf16")]


def test_a_method_that_fails_is_reported_not_hidden() -> None:
    options = tiny_options(
        configs=["core"], methods=["eager"], timer_overhead=False, overrides=[*TINY, "run.batch_size=300"]
    )  # larger than the 256 rows: config error
    with pytest.raises(Exception, match="exceeds replay.capacity"):
        run_bench(options, torch.device("cpu"), log=lambda line: None)


def test_cli_bench_rejects_unknown_names_with_exit_2() -> None:
    result = CliRunner().invoke(app, ["bench", "--configs", "huge", "--device", "cpu"])
    assert result.exit_code == 2
    assert "error: unknown bench names huge" in result.output


def test_cli_bench_runs_and_writes_files(tmp_path: Path) -> None:
    args = [
        "bench",
        "--device",
        "cpu",
        "--configs",
        "core",
        "--methods",
        "eager",
        "--batch-size",
        "4",
        "--capacity",
        "64",
        "--obs-dim",
        "16",
        "--steps",
        "2",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--steps-per-replay",
        "1",
        "--no-timer-overhead",
        "--out",
        str(tmp_path),
    ]
    for override in TINY:
        args += ["-o", override]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "eager" in result.output.splitlines()[-1]
    assert {path.name for path in tmp_path.iterdir()} == {"bench.json", "bench.png", "bench.md"}


@pytest.mark.slow  # a cold CPU compilation of the step: 1.5 minutes on 2 cores
def test_the_torch_compile_baseline_runs_the_eager_step() -> None:
    """`compile` is the eager plan with train_step under torch.compile: same batches, same maths."""
    from trainer.algo.model import ModelDims
    from trainer.algo.state import TrainState
    from trainer.algo.step import NO_TIMER
    from trainer.execution.plans.compiled import CompiledEagerPlan
    from trainer.execution.plans.eager import EagerPlan

    # core: the full preset's extra parts (vaccine, causal, ensemble, HER) compile in the GPU equivalence
    # tests of the fused plan; here they would double a cold CPU compilation
    config = preset_config("core", tiny_options())
    states = []
    for plan_class in (EagerPlan, CompiledEagerPlan):
        replay = ReplayBuffer(config, bench_spec(config), "cpu", torch.Generator().manual_seed(1))
        fill_with_random_transitions(replay, 256, seed=0)
        spec = replay.spec
        state = TrainState.create(
            config, ModelDims.build(config.model, spec.obs_dim, spec.branches, spec.actions), "cpu"
        )
        plan = plan_class(state, replay, config, NO_TIMER, torch.Generator().manual_seed(2))
        for step in range(3):  # one StepFlags variant in core: one compilation, then what it compiled
            plan.run(step)
        states.append(state.tensors())
    eager, compiled = states
    errors = {  # ‖compiled − eager‖ / ‖eager‖: Inductor reorders float32 sums, nothing more
        name: float((compiled[name].double() - tensor.double()).norm() / tensor.double().norm().clamp(min=1e-12))
        for name, tensor in eager.items()
    }
    assert {name: error for name, error in errors.items() if error > 1e-4} == {}


def test_train_rows_time_real_training_with_collection_on_cpu(tmp_path: Path) -> None:
    options = tiny_options(
        configs=[],
        train=["cartpole"],
        train_plans=["eager", "zerocopy"],
        train_updates=20,
        train_overrides=SMALL_CARTPOLE,
    )
    check_options(options)
    document = run_bench(options, torch.device("cpu"), log=lambda line: None)
    eager, zerocopy = document["train"]
    assert eager["error"] is None and eager["plan"] == "eager" and eager["updates"] == 20
    assert eager["updates_per_s"] == pytest.approx(1e3 / eager["ms_per_update"])
    assert eager["updates_per_s"] == pytest.approx(20 / eager["seconds"])
    assert all(eager["breakdown_ms"][name] > 0 for name in ("act", "env", "store", "sample", "adam"))
    assert zerocopy["error"].startswith("not run: plan 'zerocopy' needs a CUDA GPU")
    table = format_table(document)
    assert "updates/s" in table and "zerocopy" in table and "failed: not run" in table
    # the last column: ms/update over the update's own ms (the epoch target of issue 15: <= 1.25)
    eager_line = next(line for line in table.splitlines() if line.startswith("cartpole eager"))
    update = sum(ms for name, ms in eager["breakdown_ms"].items() if name not in COLLECT_COMPONENTS and name != "step")
    assert float(eager_line.split()[-1]) == pytest.approx(eager["ms_per_update"] / update, abs=0.01)
    paths = write_outputs(document, tmp_path, "python -m trainer bench --train cartpole")
    assert json.loads(paths[0].read_text())["train"][0]["plan"] == "eager"


def test_the_market_train_row_runs_its_torch_environment_on_the_training_device() -> None:
    small_market = [o for o in SMALL_CARTPOLE if not o.startswith("data.learning_starts")]
    small_market += ["data.learning_starts=64", "data.num_envs=4", "data.market_features=16", "replay.capacity=2048"]
    options = tiny_options(
        configs=[], train=["market"], train_plans=["eager"], train_updates=20, train_overrides=small_market
    )
    check_options(options)
    (row,) = run_bench(options, torch.device("cpu"), log=lambda line: None)["train"]
    assert row["error"] is None and row["recipe"] == "market" and row["updates"] == 20
    assert all(row["breakdown_ms"][name] > 0 for name in ("act", "env", "store"))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"train": ["pong"]}, "unknown train names pong"),
        ({"train": ["cartpole"], "train_plans": ["warp"]}, "unknown train names warp"),
        ({"train": ["cartpole"], "train_updates": 25, "steps_per_replay": 10, "steps": 10}, "train updates"),
    ],
)
def test_bad_train_options_are_one_line_errors(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_options(tiny_options(**changes))


def test_a_pack_method_with_combo_runs_as_its_plan_with_combined_kernels() -> None:
    from trainer.tools.bench import method_config, pack_base

    assert pack_base("fused-bf16+combo") == "fused" and pack_base("graph-bf16") == "graph"
    config = method_config(preset_config("core", BenchOptions()), "fused-bf16+combo")
    assert config.run.combo_kernels and config.run.precision == "bf16"  # the pack compiles with PACK_COMBO_OPTIONS
    check_options(tiny_options(pack=[2], pack_methods=["fused-bf16+combo"]))
