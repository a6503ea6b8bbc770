"""The one-kernel spectral projection against the per-matrix loop (`trainer.algo.budgets`). On the CPU through
Triton's interpreter (its programs one after another), on the GPU side by side and compiled by Inductor
inside a graph too."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from tests.factories import matrix_mask, padded_layout
from trainer.algo.budgets import spectral_project, spectral_project_fused, spectral_project_per_matrix
from trainer.algo.model import ParamLayout, ParamSpec
from trainer.execution.kernels.spectral import MAX_COLUMNS, spectral_power_step, supports

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def tall_and_wide_layout() -> ParamLayout:
    """A matrix of many programs' rows (1500 rows: 47 programs of 32) beside one 300 columns wide (BLOCK_C 512)."""
    return ParamLayout(
        [
            ParamSpec("tall_w", (1500, 5), 5, matrix=True),
            ParamSpec("tall_b", (1500,), 5),
            ParamSpec("wide_w", (3, 300), 300, matrix=True),
        ]
    )


def _inputs(layout: ParamLayout, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    params = torch.randn(layout.size, generator=generator) * 3.0
    v = torch.cat(
        [
            torch.nn.functional.normalize(torch.randn(spec.shape[1], generator=generator), dim=0)
            for spec in layout.matrices()
        ]
    )
    return params.to(DEVICE), v.to(DEVICE)


@pytest.mark.parametrize("layout", [padded_layout(), tall_and_wide_layout()], ids=["padded", "tall-and-wide"])
def test_the_kernel_is_the_per_matrix_power_iteration(layout: ParamLayout) -> None:
    """float32 with the reductions in another order; every element outside the matrices is bit-for-bit the
    input, and a matrix inside the bound stays as it is."""
    params, v = _inputs(layout, seed=5)
    small = layout.matrices()[-1].name
    layout.views(params)[small].mul_(1e-3)
    new, new_v = spectral_project_fused(params, v, layout, 2.0)
    expected, expected_v = spectral_project_per_matrix(params, v, layout, 2.0)
    torch.testing.assert_close(new, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(new_v, expected_v, rtol=1e-5, atol=1e-6)
    again, again_v = spectral_project_fused(params, v, layout, 2.0)  # the counters were left at zero
    assert torch.equal(again, new) and torch.equal(again_v, new_v)  # and the shares summed in one order
    outside = ~matrix_mask(layout).to(DEVICE)
    assert torch.equal(new[outside], params[outside])
    assert torch.equal(layout.views(new)[small], layout.views(params)[small])
    assert not torch.equal(new, params)  # the other matrices were projected


def test_a_non_finite_matrix_gets_a_nan_scale_and_the_others_are_untouched() -> None:
    """NaN propagates as in torch's clamp, so the guard sees the whole matrix non-finite."""
    layout = padded_layout()
    params, v = _inputs(layout, seed=6)
    layout.views(params)["rows_w"][2, 3] = float("nan")
    new, _ = spectral_project_fused(params, v, layout, 2.0)
    assert torch.isnan(layout.views(new)["rows_w"]).all()
    expected, _ = spectral_project_per_matrix(params, v, layout, 2.0)
    for name in ("a_w", "cols_w", "e_w"):
        torch.testing.assert_close(layout.views(new)[name], layout.views(expected)[name], rtol=1e-5, atol=1e-6)


def test_matrices_wider_than_a_program_are_refused() -> None:
    assert supports(MAX_COLUMNS) and not supports(MAX_COLUMNS + 1)
    params, v = torch.zeros(8, device=DEVICE), torch.zeros(2, device=DEVICE)
    table = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="at most 1024 columns"):
        spectral_power_step(params, v, table, table, table, table, table, table.int(), 1.0, 2, MAX_COLUMNS + 1)


@pytest.mark.gpu
def test_compiled_on_the_gpu_the_projection_is_the_kernel_in_one_graph() -> None:
    layout = padded_layout()
    params, v = _inputs(layout, seed=7)
    torch._dynamo.reset()
    compiled = torch.compile(spectral_project, fullgraph=True, dynamic=False)
    (new, new_v), sources = run_and_get_code(compiled, params, v, layout, 2.0)
    assert any("foxhunt.spectral_power_step" in source for source in sources)
    expected, expected_v = spectral_project_per_matrix(params, v, layout, 2.0)
    torch.testing.assert_close(new, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(new_v, expected_v, rtol=1e-5, atol=1e-6)
