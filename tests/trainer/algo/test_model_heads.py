"""The heads' first layers as one product (`heads1_w`): same parameters, same outputs, same gradients."""

import torch
import torch.nn.functional as fn

from tests.factories import tiny_config, tiny_state
from trainer.algo.losses.c51 import dueling_logits
from trainer.algo.model import ModelDims, ParamLayout, c51_logits, ensemble_logits, head_hidden, main_layout


def _separate_heads(p: dict[str, torch.Tensor], h_s2: torch.Tensor, d: ModelDims) -> tuple[torch.Tensor, torch.Tensor]:
    """C51 and ensemble logits with one product per head's first layer (the formulas before merging)."""
    value = fn.linear(fn.relu(fn.linear(h_s2, p["value1_w"], p["value1_b"])), p["value2_w"], p["value2_b"])
    value = value[:, None, None, :]  # [B, 1, 1, N]
    adv = fn.linear(fn.relu(fn.linear(h_s2, p["adv1_w"], p["adv1_b"])), p["adv2_w"], p["adv2_b"])
    c51 = dueling_logits(value, adv.view(-1, d.branches, d.actions, d.atoms))  # [B, K, A, N]
    hidden = fn.relu(torch.einsum("bh,eoh->ebo", h_s2, p["ens1_w"]) + p["ens1_b"][:, None, :])  # [E, B, h]
    ens = torch.einsum("ebh,eoh->ebo", hidden, p["ens2_w"]) + p["ens2_b"][:, None, :]  # [E, B, K·A·N]
    ens = ens.view(d.ensemble_heads, -1, d.branches, d.actions, d.atoms)
    return c51, torch.stack([dueling_logits(value, ens[e]) for e in range(d.ensemble_heads)])


def test_grouping_moves_the_heads_first_layers_together_without_changing_any_parameter() -> None:
    state = tiny_state(tiny_config())  # two ensemble heads
    layout = main_layout(state.dims)
    plain = ParamLayout(layout.specs)  # the same specs, one after another
    a = layout.init(torch.Generator().manual_seed(0), torch.device("cpu"))
    b = plain.init(torch.Generator().manual_seed(0), torch.device("cpu"))
    for spec in layout.specs:
        assert torch.equal(layout.views(a)[spec.name], plain.views(b)[spec.name]), spec.name
    h, e, hidden = state.dims.head_hidden, state.dims.ensemble_heads, state.dims.hidden
    views = layout.views(a)
    assert views["heads1_w"].shape == ((2 + e) * h, hidden) and views["heads1_b"].shape == ((2 + e) * h,)
    assert torch.equal(
        views["heads1_w"], torch.cat([views["value1_w"], views["adv1_w"], views["ens1_w"].flatten(0, 1)])
    )
    assert views["heads1_w"].data_ptr() == views["value1_w"].data_ptr()  # a view: one product reads all rows


def test_merged_first_layers_give_the_separate_heads_outputs_and_gradients() -> None:
    state = tiny_state(tiny_config())
    d = state.dims
    online = state.online.clone().requires_grad_(True)
    h_s2 = torch.randn(8, d.hidden, generator=torch.Generator().manual_seed(1))
    p = state.main.views(online)
    hidden = head_hidden(p, h_s2, d, ensemble=True)  # [B, (2+E)·h]
    merged = (c51_logits(p, h_s2, d), c51_logits(p, h_s2, d, hidden), ensemble_logits(p, h_s2, d, hidden))
    c51, ens = _separate_heads(p, h_s2, d)
    for got, want in zip(merged, (c51, c51, ens), strict=True):
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    upstream = [torch.randn(t.shape, generator=torch.Generator().manual_seed(2)) for t in (c51, ens)]
    (got,) = torch.autograd.grad(merged[1], online, upstream[0], retain_graph=True)
    (want,) = torch.autograd.grad(c51, online, upstream[0], retain_graph=True)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    (got,) = torch.autograd.grad(merged[2], online, upstream[1], retain_graph=True)
    (want,) = torch.autograd.grad(ens, online, upstream[1])
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
