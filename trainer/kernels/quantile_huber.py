"""IQN's pairwise quantile Huber loss as one Triton kernel: the loss and its gradient in one pass.

The same mathematics as `trainer.losses.iqn.quantile_huber_loss`, executed differently. Inductor
generates that function's forward and backward over all B·T·T'·K pairs (3.1 M in the pinned model);
the forward's reduction was the largest kernel of the fused step (0.25 ms, H200 profile of run 4).
Here each sample gets one program that forms its T×T' pairs per branch in registers and writes
both the per-sample loss [B] and ∂loss_b/∂quantiles [B, T, K]; the backward is then one pointwise
product (grad_out[b] · that derivative).

The kernel is wrapped as an opaque custom op (`foxhunt::quantile_huber`, with a fake for tracing)
under an autograd.Function with `setup_context`, so Dynamo keeps the step one graph around it,
`torch.func.grad` differentiates it, and the plans' CUDA graph capture records its launch like any
other kernel. With TRITON_INTERPRET=1 it runs on the CPU (the unit tests).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from trainer.losses.iqn import check_quantile_huber_inputs


@triton.jit
def _quantile_huber_kernel(
    quantiles_ptr,  # [B, T, K]
    target_ptr,  # [B, Tt, K]
    tau_ptr,  # [B, T]
    loss_ptr,  # [B] out
    grad_ptr,  # [B, T, K] out: ∂loss_b/∂quantiles[b]
    T,
    Tt,
    kappa,
    scale,  # 1 / (kappa · Tt · K): the mean over T' and branches, and rho's 1/kappa
    K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_TT: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    t = tl.arange(0, BLOCK_T)  # [BT]
    tt = tl.arange(0, BLOCK_TT)  # [BTt]
    t_in, tt_in = t < T, tt < Tt
    pair_in = t_in[:, None] & tt_in[None, :]  # [BT, BTt]
    tau = tl.load(tau_ptr + b * T + t, mask=t_in, other=0.0).to(tl.float32)  # [BT]
    loss = tl.zeros([BLOCK_T], dtype=tl.float32)
    for k in tl.static_range(K):
        z = tl.load(quantiles_ptr + (b * T + t) * K + k, mask=t_in, other=0.0).to(tl.float32)  # [BT]
        z_target = tl.load(target_ptr + (b * Tt + tt) * K + k, mask=tt_in, other=0.0).to(tl.float32)  # [BTt]
        u = z_target[None, :] - z[:, None]  # [BT, BTt]
        abs_u = tl.abs(u)
        huber = tl.where(abs_u <= kappa, 0.5 * u * u, kappa * (abs_u - 0.5 * kappa))
        weight = tl.abs(tau[:, None] - tl.where(u < 0.0, 1.0, 0.0))  # |tau - 1{u < 0}|
        loss += tl.sum(tl.where(pair_in, weight * huber, 0.0), axis=1)
        # ∂rho/∂z = -|tau - 1{u < 0}| · clamp(u, -kappa, kappa) (· 1/kappa, in scale)
        d_huber = tl.minimum(tl.maximum(u, -kappa), kappa)
        grad = tl.sum(tl.where(pair_in, -weight * d_huber, 0.0), axis=1) * scale  # [BT]
        tl.store(grad_ptr + (b * T + t) * K + k, grad, mask=t_in)
    tl.store(loss_ptr + b, tl.sum(loss, axis=0) * scale)


@torch.library.custom_op("foxhunt::quantile_huber", mutates_args=())
def _quantile_huber(quantiles: Tensor, target_quantiles: Tensor, tau: Tensor, kappa: float) -> tuple[Tensor, Tensor]:
    """(per-sample loss [B], ∂loss_b/∂quantiles [B, T, K]); inputs contiguous, float32."""
    B, T, K = quantiles.shape
    Tt = target_quantiles.shape[1]
    loss = quantiles.new_empty(B)
    grad = torch.empty_like(quantiles)
    _quantile_huber_kernel[(B,)](
        quantiles,
        target_quantiles,
        tau,
        loss,
        grad,
        T,
        Tt,
        kappa,
        1.0 / (kappa * Tt * K),
        K=K,
        BLOCK_T=triton.next_power_of_2(T),
        BLOCK_TT=triton.next_power_of_2(Tt),
    )
    return loss, grad


@_quantile_huber.register_fake
def _(quantiles: Tensor, target_quantiles: Tensor, tau: Tensor, kappa: float) -> tuple[Tensor, Tensor]:
    return quantiles.new_empty(quantiles.shape[0]), torch.empty_like(quantiles)


class _QuantileHuber(torch.autograd.Function):
    """The kernel's loss with its own derivative as the backward; `setup_context` (not a combined
    forward) is what lets `torch.func.grad` differentiate it."""

    @staticmethod
    def forward(quantiles: Tensor, target_quantiles: Tensor, tau: Tensor, kappa: float) -> tuple[Tensor, Tensor]:
        return _quantile_huber(quantiles, target_quantiles, tau, kappa)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
        ctx.save_for_backward(output[1])
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _: Tensor) -> tuple[Tensor, None, None, None]:
        (d_loss_d_quantiles,) = ctx.saved_tensors  # [B, T, K]
        return grad_loss[:, None, None] * d_loss_d_quantiles, None, None, None


def quantile_huber_loss_fused(quantiles: Tensor, target_quantiles: Tensor, tau: Tensor, kappa: float) -> Tensor:
    """`quantile_huber_loss` [B] by the Triton kernel; gradients reach only `quantiles`."""
    check_quantile_huber_inputs(quantiles, target_quantiles, tau, kappa)
    dtype = quantiles.dtype
    inputs = (quantiles.float(), target_quantiles.detach().float(), tau.detach().float())
    loss, _ = _QuantileHuber.apply(*(x.contiguous() for x in inputs), kappa)
    return loss.to(dtype)
