"""scripts/bench_small_ops.py's pack forms: split-K by hand gives the batched product's weight gradients, and the
attention forms (as the pack runs it, the runs folded into SDPA's batch, written out as products or sums) the same
output and gradients; its earlier priority write-back writes what the sampler's does now."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from scripts.bench_small_ops import (
    AS_THE_PACK,
    FOLDED,
    attention_by_products,
    attention_by_sums,
    attention_forms,
    priorities_max_of_powers,
    split_k_bmm,
)
from trainer.algo.replay.sampler import PrioritizedSampler


@pytest.mark.parametrize("chunks", [1, 4, 8])
def test_split_k_is_each_runs_weight_gradient(chunks: int) -> None:
    generator = torch.Generator().manual_seed(0)
    dy = torch.randn(3, 64, 5, generator=generator, dtype=torch.float64)  # [R, rows, outputs]
    x = torch.randn(3, 64, 7, generator=generator, dtype=torch.float64)  # [R, rows, inputs]
    got = split_k_bmm(dy, x, chunks)
    assert got.shape == (3, 5, 7)
    for run in range(3):
        torch.testing.assert_close(got[run], dy[run].T @ x[run], rtol=1e-12, atol=1e-12)


def test_split_k_refuses_rows_that_do_not_split() -> None:
    with pytest.raises(ValueError, match="48 rows do not split into 5 chunks"):
        split_k_bmm(torch.zeros(1, 48, 2), torch.zeros(1, 48, 3), 5)


def test_the_pack_attention_forms_agree() -> None:
    """On the CPU, float64: the pack's 5-D attention (math, written-out gradient), the runs folded into SDPA's
    batch, and run 0 alone (the first run's rows of the others)."""
    generator = torch.Generator().manual_seed(1)
    q, k, v, grad = (torch.randn(3, 2, 4, 16, 8, generator=generator, dtype=torch.float64) for _ in range(4))
    forms = {name: form() for name, form in attention_forms(q, k, v, grad, compiled=False).items()}
    for want, got in zip(forms[AS_THE_PACK], forms[FOLDED], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for want, got in zip(forms[AS_THE_PACK], forms["one run's SDPA"], strict=True):
        torch.testing.assert_close(got, want[: got.numel()], rtol=1e-10, atol=1e-10)  # run 0 is the first rows


def test_attention_written_out_as_products_and_as_sums_is_attention() -> None:
    """Both written-out forms `--ops packattn` compiles, forward and backward (autograd of each), against SDPA's
    on the CPU in float64; eager here (the GPU run compiles them and checks again)."""
    generator = torch.Generator().manual_seed(2)
    q, k, v, grad = (torch.randn(2, 3, 4, 16, 8, generator=generator, dtype=torch.float64) for _ in range(4))

    def output_and_gradients(attend: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = attend(*leaves)
        return [out, *torch.autograd.grad(out, leaves, grad)]

    want = output_and_gradients(torch.nn.functional.scaled_dot_product_attention)
    for attend in (attention_by_products, attention_by_sums):
        for got, expected in zip(output_and_gradients(attend), want, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_the_priority_write_back_before_and_now_write_the_same_leaves() -> None:
    """Compiled (aot_eager: the sampler's compiled branch, the pairwise max): the max of the powers and the power
    of the max, over slots drawn up to four times, leave the same leaves and max priority."""
    generator = torch.Generator().manual_seed(0)
    index = torch.randint(0, 64, (256,), generator=generator)
    loss = torch.rand(256, generator=generator) * 10.0
    loss[7] = float("nan")  # written as the max priority so far
    samplers = []
    for write in (priorities_max_of_powers, PrioritizedSampler.update):
        sampler = PrioritizedSampler(256, "cpu", alpha=0.6, beta_start=0.4, beta_end=1.0, total_steps=10, search="cdf")
        sampler.on_write(torch.arange(256), 256)
        torch.compile(write, backend="aot_eager", fullgraph=True)(sampler, index, loss)
        samplers.append(sampler)
    before, now = samplers
    assert not torch.equal(now.priorities(), torch.ones(256, dtype=torch.float64))  # the write-back was real
    torch.testing.assert_close(now.priorities(), before.priorities(), rtol=1e-15, atol=0.0)
    assert torch.equal(now.max_priority, before.max_priority)
