"""The Triton window-attention kernels against the reference maths (`trainer.algo.model.self_attention`, SDPA):
output, gradient, torch.func and torch.compile around them, and whole training steps. On the CPU through
Triton's interpreter (float32; the interpreter has no bfloat16), on the GPU in bfloat16 too."""

from __future__ import annotations

import pytest
import torch

from tests.factories import steps_with_kernels, tiny_config, tiny_state
from trainer.algo.model import self_attention
from trainer.execution.kernels.window_attention import supports, window_attention_fused

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _qkv(batch: int, window: int, heads: int, head_dim: int, seed: int = 0) -> torch.Tensor:
    """Packed projections [B, W, 3, h, d], wide enough that the softmax is far from uniform."""
    generator = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(batch, window, 3, heads, head_dim, generator=generator)).to(DEVICE)


def _output_and_grad(attend, qkv, grad_out):  # type: ignore[no-untyped-def]
    out, vjp = torch.func.vjp(attend, qkv)
    return out, vjp(grad_out)[0]


@pytest.mark.parametrize(
    ("batch", "window", "heads", "head_dim"),
    [(5, 16, 4, 32), (3, 32, 2, 16), (2, 16, 1, 64)],
    ids=["pinned", "longer-window", "one-wide-head"],
)
def test_output_and_gradient_match_sdpa(batch: int, window: int, heads: int, head_dim: int) -> None:
    qkv = _qkv(batch, window, heads, head_dim)
    grad_out = torch.randn(batch, window, heads, head_dim, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    want_out, want_grad = _output_and_grad(self_attention, qkv.double(), grad_out.double())
    got_out, got_grad = _output_and_grad(window_attention_fused, qkv, grad_out)
    assert got_out.shape == (batch, window, heads, head_dim) and got_grad.shape == qkv.shape
    torch.testing.assert_close(got_out.double(), want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grad.double(), want_grad, rtol=1e-4, atol=1e-4)
    assert got_grad.abs().amax(dim=(0, 1, 3, 4)).min() > 0  # q, k and v each get a gradient


def test_compiled_in_one_graph_it_matches_the_reference() -> None:
    """fullgraph=True: Dynamo keeps the step one graph around the kernels (the fused plans' requirement)."""
    qkv = _qkv(4, 16, 2, 16)
    weight = torch.randn(4, 16, 2, 16, generator=torch.Generator().manual_seed(2)).to(DEVICE)

    def loss(attend, x):  # type: ignore[no-untyped-def]
        return (weight * attend(x)).square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(torch.func.grad_and_value(lambda x: loss(window_attention_fused, x)), fullgraph=True)
    got_grad, got_loss = compiled(qkv)
    want_grad, want_loss = torch.func.grad_and_value(lambda x: loss(self_attention, x))(qkv.double())
    torch.testing.assert_close(got_loss.double(), want_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grad.double(), want_grad, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(DEVICE == "cuda", reason="CPU state through the interpreter; on a GPU the plans' tests run it")
def test_training_steps_with_the_kernels_match_the_reference_steps() -> None:
    """The step's Hyper.attend swapped for the kernels (what the fused plans do): three updates land on the
    same state, the attention model's parameters and Adam moments included."""
    config = tiny_config(["model.attn_window=16", "model.attn_dim=32", "model.attn_heads=2"])
    fused = steps_with_kernels(config, {"attend": window_attention_fused})
    assert not torch.equal(fused.attn_params, tiny_state(config).attn_params)  # the attention model trained


def test_supported_shapes_are_powers_of_two_from_16_to_128() -> None:
    assert supports(16, 32) and supports(128, 16)
    assert not supports(8, 32) and not supports(16, 24) and not supports(256, 32)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((2, 12, 3, 2, 16), torch.float32), ((2, 16, 2, 2, 16), torch.float32), ((2, 16, 3, 2, 16), torch.float64)],
    ids=["window-12", "not-packed-qkv", "float64"],
)
def test_what_the_kernels_cannot_run_is_refused_with_the_reason(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match=r"\[B, W, 3, heads, d\] with W and d powers of two"):
        window_attention_fused(torch.zeros(shape, dtype=dtype, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bfloat16_matches_sdpa_within_bfloat16_rounding() -> None:
    """What the bf16 plans run: bf16 operands, float32 scores and softmax; SDPA's flash kernel as reference."""
    qkv = _qkv(64, 16, 4, 32).to(torch.bfloat16)
    grad_out = torch.randn(64, 16, 4, 32, device=DEVICE, dtype=torch.bfloat16)
    want_out, want_grad = _output_and_grad(self_attention, qkv.double(), grad_out.double())
    got_out, got_grad = _output_and_grad(window_attention_fused, qkv, grad_out)
    assert got_out.dtype == got_grad.dtype == torch.bfloat16
    sdpa_out, sdpa_grad = _output_and_grad(self_attention, qkv, grad_out)
    for got, sdpa, want in [(got_out, sdpa_out, want_out), (got_grad, sdpa_grad, want_grad)]:
        # within twice SDPA's own error from the float64 result
        limit = 2 * (sdpa.double() - want).norm() / want.norm()
        assert (got.double() - want).norm() / want.norm() <= max(limit, 1e-3)
