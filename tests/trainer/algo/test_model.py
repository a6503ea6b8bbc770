import math
from dataclasses import fields, replace

import torch

from contracts.config import TrainConfig, build_config
from trainer.algo.model import (
    ALIGN,
    DATA_DIMS,
    PADDED,
    ModelDims,
    ParamLayout,
    attn_layout,
    iql_layout,
    main_layout,
    output_layer,
    self_attention,
)


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
    blocks = {name: v for name, v in views.items() if name not in layout.groups and name + PADDED not in views}
    assert sum(v.numel() for v in blocks.values()) == sum(end - start for start, end in layout.offsets.values())
    assert layout.size - sum(v.numel() for v in blocks.values()) < ALIGN * len(blocks)  # gaps: alignment only
    views["trunk1_w"].sum().backward()
    start, end = layout.offsets["trunk1_w"]
    assert flat.grad[start:end].eq(1).all() and flat.grad.sum() == end - start


def test_every_parameter_starts_aligned_and_output_layers_are_padded_with_zeros() -> None:
    """The pinned model's odd widths (N = 51, K·A·N = 765, K·A = 15, the FFN's 700) stored rounded up to
    ALIGN, each parameter at a multiple of ALIGN: every product gets an aligned tensor-core tile. The pads
    are zeros, and the parameter's own view is its unpadded shape."""
    dims = ModelDims.build(TrainConfig().model, obs_dim=64, branches=3, actions=5)
    for layout in (main_layout(dims), iql_layout(dims), attn_layout(dims)):
        flat = layout.init(torch.Generator().manual_seed(0), torch.device("cpu"))
        views = layout.views(flat)
        group_members = {name for names in layout.groups.values() for name in names[1:]}
        for spec in layout.specs:
            assert spec.name in group_members or layout.offsets[spec.name][0] % ALIGN == 0, spec.name
            assert views[spec.name].shape == spec.shape
            if spec.pad_dim is not None:
                padded = views[spec.name + PADDED]
                assert padded.shape[spec.pad_dim] % ALIGN == 0
                n = spec.shape[spec.pad_dim]
                assert padded.narrow(spec.pad_dim, n, padded.shape[spec.pad_dim] - n).eq(0).all()  # zeros
        used = sum(math.prod(spec.shape) for spec in layout.specs)
        assert flat.count_nonzero() <= used
    main = main_layout(dims)
    assert main.stored["adv2_w"] == (768, dims.head_hidden) and main.stored["iqn2_w"] == (16, dims.iqn_hidden)
    assert attn_layout(dims).stored["attn_ffn2_w"] == (dims.attn_dim, 704)


def test_padding_keeps_initialisation_draws_and_outputs() -> None:
    """The padded layout draws the same initial values as an unpadded one would (logical shapes), and the
    padded product sliced equals the plain one."""
    dims = ModelDims.build(TrainConfig().model, obs_dim=64, branches=3, actions=5)
    layout = main_layout(dims)
    plain = ParamLayout([replace(spec, pad_dim=None) for spec in layout.specs])
    a = layout.views(layout.init(torch.Generator().manual_seed(3), torch.device("cpu")))
    b = plain.views(plain.init(torch.Generator().manual_seed(3), torch.device("cpu")))
    for spec in layout.specs:
        assert torch.equal(a[spec.name], b[spec.name]), spec.name
    hidden = torch.randn(4, dims.head_hidden)
    out = output_layer(hidden, a, "adv2")
    assert out.shape == (4, 765)
    torch.testing.assert_close(out, torch.nn.functional.linear(hidden, a["adv2_w"], a["adv2_b"]))


def test_self_attention_is_softmax_of_scaled_scores_times_values_per_head() -> None:
    """The packed layout [B, W, 3, h, d] read as q, k, v per head, against the formula in float64."""
    qkv = torch.randn(2, 5, 3, 2, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, h, W, d]
    weights = (q @ k.transpose(-1, -2) / math.sqrt(4)).softmax(-1)  # [B, h, W, W]
    torch.testing.assert_close(self_attention(qkv), (weights @ v).transpose(1, 2), rtol=1e-12, atol=1e-12)
