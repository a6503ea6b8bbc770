"""The pack's split-K pass (`trainer.execution.split_k`): products over long rows rewritten, the rest left, the
results the products'."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from trainer.execution.split_k import SplitLongRows


def compiled(split: SplitLongRows, fn: object) -> object:
    torch._dynamo.reset()
    return torch.compile(fn, options={"post_grad_custom_post_pass": split, "fx_graph_cache": False})


def weight_gradient(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Each run's Σ_rows dyᵀ x, as autograd batches a vmapped linear layer's weight gradient."""
    return torch.bmm(dy.transpose(1, 2), x)  # [R, out, in]


def test_a_product_over_long_rows_is_its_chunks_products_summed() -> None:
    generator = torch.Generator().manual_seed(0)
    dy = torch.randn(3, 128, 5, generator=generator, dtype=torch.float64)  # [R, rows, out]
    x = torch.randn(3, 128, 7, generator=generator, dtype=torch.float64)  # [R, rows, in]
    traced = make_fx(weight_gradient, tracing_mode="fake")(dy, x)  # aten nodes with fake values, as Inductor's
    split = SplitLongRows(min_rows=64, chunk_rows=16, max_outputs=64)
    split(traced.graph)
    traced.recompile()
    products = [node.meta["val"].shape for node in traced.graph.nodes if node.target is torch.ops.aten.bmm.default]
    assert products == [(24, 5, 7)] and split.rewritten == [(3, 5, 128, 7)]  # 3 runs x 8 chunks of 16 rows
    torch.testing.assert_close(traced(dy, x), weight_gradient(dy, x), rtol=1e-12, atol=1e-12)


def test_inductor_compiles_the_rewritten_product() -> None:
    split = SplitLongRows(min_rows=64, chunk_rows=16, max_outputs=64)
    dy, x = torch.randn(3, 128, 5, dtype=torch.float64), torch.randn(3, 128, 7, dtype=torch.float64)
    got = compiled(split, weight_gradient)(dy, x)
    assert split.rewritten == [(3, 5, 128, 7)]
    torch.testing.assert_close(got, weight_gradient(dy, x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("rows", "outputs", "why"),
    [(48, 5, "too few rows"), (136, 5, "rows not a multiple of the chunk"), (128, 16, "a result of 16 x 7 > 64")],
)
def test_other_products_are_left_as_they_are(rows: int, outputs: int, why: str) -> None:
    split = SplitLongRows(min_rows=64, chunk_rows=16, max_outputs=64)
    dy, x = torch.randn(2, rows, outputs, dtype=torch.float64), torch.randn(2, rows, 7, dtype=torch.float64)
    got = compiled(split, weight_gradient)(dy, x)
    assert split.rewritten == [], why
    torch.testing.assert_close(got, weight_gradient(dy, x), rtol=1e-12, atol=1e-12)


def test_an_operand_whose_rows_are_not_views_of_chunks_is_left_as_it_is() -> None:
    """x stored transposed ([R, in, rows] seen as [R, rows, in]): its chunks of rows cannot be batched as views."""
    split = SplitLongRows(min_rows=64, chunk_rows=16, max_outputs=64)
    dy, x_t = torch.randn(2, 128, 5, dtype=torch.float64), torch.randn(2, 7, 128, dtype=torch.float64)
    got = compiled(split, lambda dy, x_t: weight_gradient(dy, x_t.transpose(1, 2)))(dy, x_t)
    torch.testing.assert_close(got, weight_gradient(dy, x_t.transpose(1, 2)), rtol=1e-12, atol=1e-12)
    assert split.rewritten == []
