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
