from dataclasses import fields

import torch

from trainer.config import TrainConfig, build_config
from trainer.model import DATA_DIMS, ModelDims, attn_layout, iql_layout, main_layout


def test_dims_are_the_data_sources_sizes_and_the_model_configs_same_named_fields() -> None:
    model = build_config({"model": {"hidden": 7, "atoms": 9, "v_min": -3.5, "ensemble_heads": 2}}).model
    dims = ModelDims.build(model, obs_dim=5, branches=2, actions=4)
    assert (dims.obs_dim, dims.branches, dims.actions) == (5, 2, 4)
    copied = [f.name for f in fields(ModelDims) if f.name not in DATA_DIMS]
    assert copied and set(copied) <= set(type(model).model_fields)
    assert all(getattr(dims, name) == getattr(model, name) for name in copied)
    assert (dims.hidden, dims.atoms, dims.v_min, dims.ensemble_heads) == (7, 9, -3.5, 2)


def test_pinned_model_parameter_counts() -> None:
    """docs/architecture.md ("Conventions"): main + IQN + IQL ≈ 321K; attention auxiliary ≈ 263K."""
    dims = ModelDims.build(TrainConfig().model, obs_dim=64, branches=3, actions=5)
    main, iql, attn = main_layout(dims).size, iql_layout(dims).size, attn_layout(dims).size
    assert 315_000 < main + iql < 325_000
    assert 255_000 < attn < 270_000


def test_views_are_differentiable_slices_of_one_buffer() -> None:
    dims = ModelDims.build(TrainConfig().model, obs_dim=8, branches=2, actions=3)
    layout = main_layout(dims)
    flat = torch.zeros(layout.size, requires_grad=True)
    views = layout.views(flat)
    assert sum(v.numel() for name, v in views.items() if name not in layout.groups) == layout.size
    views["trunk1_w"].sum().backward()
    start, end = layout.offsets["trunk1_w"]
    assert flat.grad[start:end].eq(1).all() and flat.grad.sum() == end - start
