"""`scripts/profile_pack.py`'s runs: `core`'s model, or a recipe's, in the precision asked for."""

from __future__ import annotations

from scripts.profile_pack import base_config


def test_without_a_recipe_the_packs_run_core_in_float32_unless_told() -> None:
    core = base_config(None, None, 4096)
    assert (core.run.precision, core.replay.capacity) == ("fp32", 4096)
    assert base_config(None, "bf16", 4096).run.precision == "bf16"


def test_a_recipe_keeps_its_model_batch_and_precision_unless_told() -> None:
    market = base_config("examples/market.yaml", None, 100_000)
    assert (market.model.hidden, market.run.batch_size, market.replay.her) == (128, 128, True)
    assert (market.run.precision, market.replay.capacity) == ("auto", 100_000)
    assert base_config("examples/market.yaml", "bf16", 100_000).run.precision == "bf16"


def test_overrides_go_over_core_and_a_recipe_alike() -> None:
    assert base_config(None, None, 4096, ["run.combo_kernels=true"]).run.combo_kernels
    market = base_config("examples/market.yaml", None, 100_000, ["run.combo_kernels=true", "model.hidden=64"])
    assert market.run.combo_kernels and market.model.hidden == 64 and market.replay.capacity == 100_000


def test_on_the_cpu_the_table_has_inductors_kernels_and_aten_ops_by_cpu_time() -> None:
    """`cpu_kernels` (the `--device cpu` table) over a stand-in for a compiled pack: a compiled function beside an
    eager product. Inductor's generated kernels are profiler events of their own with `cpp.enable_kernel_profile`
    (as `--device cpu` sets it), each with its calls and milliseconds per step."""
    import torch
    from torch._inductor import config as inductor_config

    from scripts.profile_pack import cpu_kernels

    x, w = torch.randn(64, 32), torch.randn(32, 32)
    fused = torch.compile(lambda a: torch.relu(a * 2.0 + 1.0).sum(dim=1), dynamic=False)

    class Plan:
        def run(self, step: int) -> None:
            fused(x @ w)

    with inductor_config.patch({"cpp.enable_kernel_profile": True}):
        Plan().run(0)
        table = cpu_kernels(Plan())  # type: ignore[arg-type]
    generated = {name: row for name, row in table.items() if name.startswith("cpp_fused_")}  # graph_N_ cut
    assert generated and all(calls == 1 and ms > 0 for calls, ms in generated.values())
    assert table["aten::mm"][0] == 1


def test_the_divergence_table_steps_a_keyed_pack_beside_its_solo_plans_and_eager_runs() -> None:
    """On the CPU (eager pack, eager solo plans) every form of a keyed run draws from the same counters, one draw of
    the replay's and one of the step's an update, samples the same slots and uniforms, and the pack stays within
    float rounding of both solo forms; the solo plan is its eager run exactly. On a GPU the same table tells which
    captured form leaves the eager numbers."""
    import torch

    from scripts.profile_pack import divergence
    from trainer.tools.bench import BenchOptions, preset_config

    core = preset_config("core", BenchOptions(batch_size=64, capacity=2_000, overrides=["run.rng=keyed"]))
    rows = divergence(core, 2_000, torch.device("cpu"), updates=2)
    assert [(row["updates"], row["run"]) for row in rows] == [(u, i) for u in (1, 2) for i in range(4)]
    for row in rows:
        assert row["counters"] == [(row["updates"], row["updates"])] * 3
        pack_solo, pack_eager, solo_eager, eager_pack = row["online"]  # type: ignore[misc]
        assert solo_eager == 0.0 and pack_solo == pack_eager == eager_pack < 1e-6  # on the CPU the pack is eager
        assert all(error < 1e-6 for error in row["priorities"])  # type: ignore[attr-defined]
        assert row["slots"] == row["uniforms"] == [True, True]  # the last update drew the same in every form
