import torch

from trainer.config import TrainConfig
from trainer.model import ModelDims, attn_layout, iql_layout, main_layout


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
