from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from tests.factories import matrix_mask, padded_layout, tiny_config, tiny_state
from trainer.algo.budgets import (
    AdamMoments,
    adam_update,
    clip_to_budget,
    combine_budgeted,
    ema,
    pruning_mask,
    spectral_project,
    spectral_project_batched,
    spectral_project_per_matrix,
    spectral_v_init,
)
from trainer.algo.model import ParamLayout

SpectralForm = Callable[[Tensor, Tensor, ParamLayout, float], tuple[Tensor, Tensor]]


def test_clip_holds_each_norm_at_its_budget() -> None:
    generator = torch.Generator().manual_seed(0)
    grads = {name: torch.randn(500, generator=generator) * 10 for name in ("c51", "cql", "iqn", "ensemble")}
    budgets = {"c51": 6.0, "cql": 2.5, "iqn": 1.0, "ensemble": 0.5}
    for name, grad in grads.items():
        clipped = clip_to_budget(grad, budgets[name])
        assert clipped.norm() == pytest.approx(budgets[name], rel=1e-5)
        # direction is kept
        assert torch.allclose(clipped / clipped.norm(), grad / grad.norm(), atol=1e-6)
    total = combine_budgeted(grads, budgets)
    expected = sum(clip_to_budget(grads[n], budgets[n]) for n in budgets)
    assert torch.allclose(total, expected)
    assert total.norm() <= sum(budgets.values()) + 1e-5


def test_clip_leaves_small_gradients_alone() -> None:
    grad = torch.full((10,), 0.01)
    assert torch.equal(clip_to_budget(grad, 1.0), grad * 1.0)


def test_adam_matches_torch_optim_adam() -> None:
    generator = torch.Generator().manual_seed(1)
    params = torch.randn(50, generator=generator)
    reference = params.clone().requires_grad_(True)
    optimiser = torch.optim.Adam([reference], lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
    moments = AdamMoments.zeros(50, torch.device("cpu"))
    for t in range(1, 6):
        grad = torch.randn(50, generator=generator)
        params, moments.m, moments.v = adam_update(params, grad, moments, torch.tensor(float(t)), 1e-2, 0.9, 0.99, 1e-8)
        reference.grad = grad.clone()
        optimiser.step()
    assert torch.allclose(params, reference.detach(), atol=1e-6)


def test_spectral_projection_bounds_sigma() -> None:
    config = tiny_config()
    state = tiny_state(config)
    with torch.no_grad():
        params = state.online.detach() * 20.0  # blow every matrix far past sigma_max
    v = state.spectral_v.clone()
    sigma_max = 1.5
    for _ in range(30):  # power iteration converges over steps, as in training
        params, v = spectral_project(params, v, state.main, sigma_max)
    views = state.main.views(params)
    for spec in state.main.matrices():
        sigma = torch.linalg.matrix_norm(views[spec.name], ord=2)
        assert sigma <= sigma_max * 1.01, spec.name


def test_spectral_projection_leaves_small_matrices() -> None:
    config = tiny_config()
    state = tiny_state(config)
    params = state.online.detach() * 1e-3
    new, _ = spectral_project(params, state.spectral_v, state.main, 5.0)
    assert torch.equal(new, params)


def test_pruning_mask_has_the_requested_sparsity_on_matrices_only() -> None:
    config = tiny_config()
    state = tiny_state(config)
    mask = pruning_mask(state.main, 0.5, torch.Generator().manual_seed(0), torch.device("cpu"))
    views = state.main.views(mask)
    for spec in state.main.specs:
        fraction_kept = views[spec.name].mean().item()
        if spec.matrix:
            assert 0.3 < fraction_kept < 0.7, spec.name
        else:
            assert fraction_kept == 1.0, spec.name


def test_ema_moves_target_by_tau() -> None:
    target, online = torch.zeros(4), torch.ones(4)
    assert torch.allclose(ema(target, online, 0.25), torch.full((4,), 0.25))


def test_each_matrix_starts_with_a_unit_right_vector() -> None:
    state = tiny_state(tiny_config())
    v = spectral_v_init(state.main, torch.Generator().manual_seed(0), torch.device("cpu"))
    columns = [spec.shape[1] for spec in state.main.matrices()]
    assert v.shape == (sum(columns),)
    for part in v.split(columns):
        assert part.norm() == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize("form", [spectral_project_per_matrix, spectral_project_batched], ids=["per-matrix", "batched"])
def test_spectral_projection_is_the_power_iteration_with_sigma_as_u_w_v(form: SpectralForm) -> None:
    """σ = ‖W v‖ (one product less) is the textbook σ = uᵀ W v with u = normalize(W v); the next v is
    normalize(Wᵀ u)."""
    config = tiny_config()
    state = tiny_state(config)
    params = state.online * 3.0
    new, new_v = form(params, state.spectral_v, state.main, 1.0)
    views, new_views, offset = state.main.views(params), state.main.views(new), 0
    for spec in state.main.matrices():
        weight, cols = views[spec.name], spec.shape[1]
        v = state.spectral_v[offset : offset + cols]
        u = torch.nn.functional.normalize(weight @ v, dim=0)
        sigma = u @ weight @ v
        assert torch.allclose(
            new_v[offset : offset + cols], torch.nn.functional.normalize(weight.t() @ u, dim=0), atol=1e-6
        )
        assert torch.allclose(new_views[spec.name], weight * (1.0 / sigma).clamp(max=1.0), rtol=1e-5, atol=1e-7)
        offset += cols


def test_the_batched_form_matches_the_per_matrix_loop_on_padded_layouts() -> None:
    """float64, so only the order of the reductions differs: agreement to float64's default tolerances. Every
    element outside the matrices (biases, other weights, pads, alignment gaps: all nonzero here) is
    bit-for-bit the input."""
    layout = padded_layout()
    generator = torch.Generator().manual_seed(3)
    params = torch.randn(layout.size, generator=generator, dtype=torch.float64) * 3.0
    layout.views(params)["e_w"].mul_(0.01)  # one matrix inside the bound: it stays as it is
    v = torch.randn(sum(spec.shape[1] for spec in layout.matrices()), generator=generator, dtype=torch.float64)
    new, new_v = spectral_project_batched(params, v, layout, 2.0)
    expected, expected_v = spectral_project_per_matrix(params, v, layout, 2.0)
    torch.testing.assert_close(new, expected)
    torch.testing.assert_close(new_v, expected_v)
    in_matrix = matrix_mask(layout)
    assert torch.equal(new[~in_matrix], params[~in_matrix])
    assert torch.equal(layout.views(new)["e_w"], layout.views(params)["e_w"])
    assert not torch.equal(layout.views(new)["cols_w"], layout.views(params)["cols_w"])  # projected


def test_compiled_spectral_projection_is_the_batched_form_in_one_graph() -> None:
    """Under torch.compile the batched form runs (eagerly, the loop), with no graph break (the index tables
    are built while tracing, not in the graph); `aot_eager` keeps it fast on the CPU."""
    layout = padded_layout()
    generator = torch.Generator().manual_seed(4)
    params = torch.randn(layout.size, generator=generator)
    v = torch.randn(sum(spec.shape[1] for spec in layout.matrices()), generator=generator)
    compiled = torch.compile(spectral_project, backend="aot_eager", fullgraph=True, dynamic=False)
    new, new_v = compiled(params, v, layout, 1.0)
    batched, batched_v = spectral_project_batched(params, v, layout, 1.0)
    assert torch.equal(new, batched) and torch.equal(new_v, batched_v)
    looped, looped_v = spectral_project(params, v, layout, 1.0)
    torch.testing.assert_close(looped, batched)
    torch.testing.assert_close(looped_v, batched_v)


def test_ema_takes_a_packs_float64_tau_and_gives_the_float_taus_result_bit_for_bit() -> None:
    """A pack whose runs differ in optim.target_tau hands each run its τ as a float64 0-d tensor (under vmap):
    lerp refused it (a double weight for float parameters), which failed every such hyper-parameter pack."""
    target, online = torch.randn(64, generator=torch.Generator().manual_seed(0)), torch.randn(64)
    taus = torch.tensor([0.005, 0.0221], dtype=torch.float64)
    packed = torch.func.vmap(ema, in_dims=(None, None, 0))(target, online, taus)
    for i, tau in enumerate(taus.tolist()):
        assert torch.equal(packed[i], ema(target, online, tau))
