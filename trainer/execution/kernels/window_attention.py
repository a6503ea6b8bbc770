"""Self-attention over short windows as two Triton kernels (forward; backward), one program per window and head.

The same mathematics as `trainer.algo.model.self_attention`, executed differently. The pinned attention model
runs B·heads = 4096 problems of W = 16 states with head size 32: cuDNN's flash kernels give each one
a CTA with 64-128 row tiles, mostly empty, and took 0.18 ms of the H200 step (forward 0.075, backward
0.11) with nothing beside them on the other stream. Here each program holds its window's q, k, v
[W, d] in registers: scores q kᵀ [W, W] (float32 accumulation), softmax, and p v; the backward
recomputes p (cheaper than storing it) and writes dq, dk, dv straight into the packed gradient of qkv.

Both kernels are opaque custom ops (`foxhunt::window_attention`, `foxhunt::window_attention_backward`,
with fakes for tracing) under an autograd.Function with `setup_context`, so Dynamo keeps the step one
graph around them, `torch.func` differentiates them, and a CUDA graph records their launches. With
TRITON_INTERPRET=1 they run on the CPU (the unit tests).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
NUM_WARPS = 4


def supports(window: int, head_dim: int) -> bool:
    """Whether the kernels take this shape: `tl.dot` needs each side a power of two of at least 16, and
    a window past 128 states no longer fits one program's registers (SDPA's tiles are full there)."""
    return all(16 <= n <= 128 and n & (n - 1) == 0 for n in (window, head_dim))


@triton.jit
def _load_qkv(qkv_ptr, b, h, heads, W: tl.constexpr, D: tl.constexpr):
    """q, k, v [W, D] of window b, head h from qkv [B, W, 3, heads, D] (contiguous)."""
    row = 3 * heads * D  # elements per state
    offsets = b * W * row + h * D + tl.arange(0, W)[:, None] * row + tl.arange(0, D)[None, :]
    q = tl.load(qkv_ptr + offsets)
    k = tl.load(qkv_ptr + offsets + heads * D)
    v = tl.load(qkv_ptr + offsets + 2 * heads * D)
    return q, k, v, offsets


@triton.jit
def _out_offsets(b, h, heads, W: tl.constexpr, D: tl.constexpr):
    """Offsets of window b, head h's [W, D] block in out [B, W, heads, D] (and in its gradient)."""
    return b * W * heads * D + h * D + tl.arange(0, W)[:, None] * (heads * D) + tl.arange(0, D)[None, :]


@triton.jit
def _softmax_scores(q, k, scale, PRECISION: tl.constexpr):
    """p = softmax(q kᵀ · scale) by rows, float32 [W, W]."""
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    p = tl.exp(scores - tl.max(scores, axis=1)[:, None])
    return p / tl.sum(p, axis=1)[:, None]


@triton.jit
def _forward_kernel(qkv_ptr, out_ptr, heads, scale, W: tl.constexpr, D: tl.constexpr, PRECISION: tl.constexpr):
    b, h = tl.program_id(0).to(tl.int64) // heads, tl.program_id(0).to(tl.int64) % heads
    q, k, v, _ = _load_qkv(qkv_ptr, b, h, heads, W, D)
    p = _softmax_scores(q, k, scale, PRECISION)
    out = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)  # [W, D]
    tl.store(out_ptr + _out_offsets(b, h, heads, W, D), out.to(out_ptr.dtype.element_ty))


@triton.jit
def _backward_kernel(
    qkv_ptr,
    grad_out_ptr,
    grad_qkv_ptr,
    heads,
    scale,
    W: tl.constexpr,
    D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b, h = tl.program_id(0).to(tl.int64) // heads, tl.program_id(0).to(tl.int64) % heads
    q, k, v, qkv_offsets = _load_qkv(qkv_ptr, b, h, heads, W, D)
    grad_out = tl.load(grad_out_ptr + _out_offsets(b, h, heads, W, D))  # [W, D]
    p = _softmax_scores(q, k, scale, PRECISION)  # [W, W]
    grad_v = tl.dot(tl.trans(p.to(grad_out.dtype)), grad_out, input_precision=PRECISION)  # pᵀ dO [W, D]
    grad_p = tl.dot(grad_out, tl.trans(v), input_precision=PRECISION)  # dO vᵀ [W, W]
    # softmax's backward: dS = p ∘ (dP − rowsum(p ∘ dP)), then the scale of the scores
    grad_scores = p * (grad_p - tl.sum(p * grad_p, axis=1)[:, None]) * scale  # [W, W]
    grad_q = tl.dot(grad_scores.to(k.dtype), k, input_precision=PRECISION)  # [W, D]
    grad_k = tl.dot(tl.trans(grad_scores.to(q.dtype)), q, input_precision=PRECISION)  # [W, D]
    out_type = grad_qkv_ptr.dtype.element_ty
    tl.store(grad_qkv_ptr + qkv_offsets, grad_q.to(out_type))
    tl.store(grad_qkv_ptr + qkv_offsets + heads * D, grad_k.to(out_type))
    tl.store(grad_qkv_ptr + qkv_offsets + 2 * heads * D, grad_v.to(out_type))


def _launch_options(qkv: Tensor) -> dict[str, Any]:
    _, W, _, _, D = qkv.shape
    # float32 products exactly as float32 (SDPA's float32 kernels do not round to TF32); ignored for bf16
    return {"W": W, "D": D, "PRECISION": "ieee" if qkv.dtype == torch.float32 else "tf32", "num_warps": NUM_WARPS}


@torch.library.custom_op("foxhunt::window_attention", mutates_args=())
def _window_attention(qkv: Tensor) -> Tensor:
    """out [B, W, heads, d] from qkv [B, W, 3, heads, d], contiguous."""
    B, W, _, heads, D = qkv.shape
    out = qkv.new_empty(B, W, heads, D)
    _forward_kernel[(B * heads,)](qkv, out, heads, D**-0.5, **_launch_options(qkv))
    return out


@_window_attention.register_fake
def _(qkv: Tensor) -> Tensor:
    B, W, _, heads, D = qkv.shape
    return qkv.new_empty(B, W, heads, D)


@torch.library.custom_op("foxhunt::window_attention_backward", mutates_args=())
def _window_attention_backward(qkv: Tensor, grad_out: Tensor) -> Tensor:
    """∂loss/∂qkv [B, W, 3, heads, d] from qkv and ∂loss/∂out [B, W, heads, d], both contiguous."""
    B, _, _, heads, D = qkv.shape
    grad_qkv = torch.empty_like(qkv)
    _backward_kernel[(B * heads,)](qkv, grad_out, grad_qkv, heads, D**-0.5, **_launch_options(qkv))
    return grad_qkv


@_window_attention_backward.register_fake
def _(qkv: Tensor, grad_out: Tensor) -> Tensor:
    return torch.empty_like(qkv)


class _WindowAttention(torch.autograd.Function):
    """The forward kernel with the backward kernel as its derivative; `setup_context` (not a combined
    forward) is what lets `torch.func` differentiate it."""

    @staticmethod
    def forward(qkv: Tensor) -> Tensor:
        return _window_attention(qkv)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> Tensor:
        (qkv,) = ctx.saved_tensors
        with torch.no_grad():  # no second derivative: torch.func.grad would otherwise trace through the op
            return _window_attention_backward(qkv, grad_out.to(qkv.dtype).contiguous())


def window_attention_fused(qkv: Tensor) -> Tensor:
    """`trainer.algo.model.self_attention` by the Triton kernels: qkv [B, W, 3, heads, d] -> [B, W, heads, d]."""
    _, W, three, _, D = qkv.shape
    if three != 3 or not supports(W, D) or qkv.dtype not in DTYPES:
        raise ValueError(
            f"window_attention_fused: qkv must be [B, W, 3, heads, d] with W and d powers of two in [16, 128], "
            f"in {', '.join(str(t) for t in DTYPES)}; got {tuple(qkv.shape)} {qkv.dtype}"
        )
    return _WindowAttention.apply(qkv.contiguous())
