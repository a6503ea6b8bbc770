"""The IQN target quantiles in one Triton kernel: the target network's quantile head at s' for T' taus, the
Double-DQN gather and r + γ(1 - done) Z, one program per BLOCK_M rows of (sample, tau) (issue 32).

The same mathematics as `trainer.algo.step.next_quantile_targets` (`iqn_quantiles`, the gather at a*,
`iqn_target`), executed differently. Inductor runs that chain as three matrix products (cos(πiτ) → H,
H → h, h → K·A) with pointwise kernels between them, each writing its [B·T', H] or [B·T', h] activations
(32,768 rows at the `core` size) to memory and reading them back. Here a program keeps its rows' activations
on chip: per chunk of BLOCK_H trunk units φ = relu(W_e cos + b_e) and ψ(s') ⊙ φ, accumulated into the hidden
layer's product, then the output layer, the gather at a* and the target, one store of [BLOCK_M, K].

Under mixed precision (the trunk's h_s2 arrives in bf16) every product takes bf16 inputs with float32
accumulation and every layer's output is rounded to bf16 once, as autocast rounds it; in float32 the products
run as the step's other products do (TF32 unless float32 matmul precision is "highest"). On the GPU a cast to
bf16 rounds (ties to even); Triton's interpreter, which runs this on the CPU, truncates its casts to bf16 and
multiplies bf16 tiles wrongly, so there the rounding is written out (`_round_bf16`) and the products run in
float32 on bf16-exact values, which is the same arithmetic.

An opaque custom op (`foxhunt::iqn_target_quantiles`, with a fake for tracing), so Dynamo keeps the target
graph whole around it and a CUDA graph records its launch. The fused plans use it when
`run.iqn_target_kernel` says so (`trainer.execution.plans.fused.FusedPlan.iqn_kernel_chosen`).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from contracts.config import IQN_KERNEL_MAX_WIDTH
from trainer.algo.model import PADDED
from trainer.execution.kernels import interpreted

ROWS_PER_PROGRAM = 128
"""(sample, tau) rows a program takes: its [128, 64] chunk of φ and [128, 128] hidden accumulator (`core`) stay in
registers, over 8 warps (H100: 31.4 µs at `core`'s bf16 size, 36.4 at 64 rows, 50.3 at 32 with 4 warps; Inductor's
written form 48.4 µs in 7 kernels; `docs/benchmarks/README.md`, issue 32 round 20). Read at each launch, as
WARPS_PER_PROGRAM is, so `scripts/bench_small_ops.py --ops iqn` can time others."""
WARPS_PER_PROGRAM = 8


def supports(embed: int, iqn_hidden: int, outputs: int) -> bool:
    """Whether a program holds iqn_embed, iqn_hidden and K·A each as one tile (padded to a power of two)."""
    return max(embed, iqn_hidden, outputs) <= IQN_KERNEL_MAX_WIDTH


@triton.jit
def _round_bf16(x):
    """x rounded to the nearest bfloat16 (ties to even), kept as float32; NaN stays NaN."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))


@triton.jit
def _relu(x):
    """relu as torch's: NaN stays NaN (the GPU's max returns the other operand), so the guard sees a poisoned sample."""
    return tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _layer(x, ROUND: tl.constexpr):
    """A layer's output as autocast leaves it: rounded to bf16 under mixed precision, by the GPU's own cast (ROUND
    1, ties to even) or, in the interpreter, whose cast truncates, by `_round_bf16` (ROUND 2); as it is in float32
    (ROUND 0)."""
    if ROUND == 1:
        return x.to(tl.bfloat16).to(tl.float32)
    if ROUND == 2:
        return _round_bf16(x)
    return x


@triton.jit
def _dot(a, b, DOT_BF16: tl.constexpr, PRECISION: tl.constexpr):
    """a @ b with float32 accumulation: as bf16 tiles (DOT_BF16: a and b hold bf16-exact values) or float32 ones."""
    if DOT_BF16:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), out_dtype=tl.float32)
    return tl.dot(a, b, input_precision=PRECISION, out_dtype=tl.float32)


@triton.heuristics(
    {
        "BLOCK_E": lambda args: _tile(args["embed"]),
        "BLOCK_H": lambda args: min(64, _tile(args["hidden"])),
        "BLOCK_I": lambda args: _tile(args["iqn_hidden"]),
        "BLOCK_O": lambda args: _tile(args["BRANCHES"] * args["actions"]),
        "DOT_BF16": lambda args: args["BF16"] and not interpreted(),
        "ROUND": lambda args: (2 if interpreted() else 1) if args["BF16"] else 0,
        "BLOCK_M": lambda args: ROWS_PER_PROGRAM,
    }
)
@triton.jit
def _target_quantiles_kernel(
    tau_ptr,
    h_ptr,
    embed_w_ptr,
    embed_b_ptr,
    hidden_w_ptr,
    hidden_b_ptr,
    out_w_ptr,
    out_b_ptr,
    action_ptr,
    reward_ptr,
    done_ptr,
    target_ptr,
    stride_h,
    stride_embed_w,
    stride_hidden_w,
    stride_out_w,
    rows,
    gamma,
    taus,
    embed,
    hidden,
    iqn_hidden,
    actions,
    BRANCHES: tl.constexpr,
    BF16: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_O: tl.constexpr,
    DOT_BF16: tl.constexpr,
    ROUND: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    row = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM] (sample, tau) pairs: row = b·T' + t
    in_rows = row < rows
    sample = row // taus  # [BM]
    e = tl.arange(0, BLOCK_E)
    u = tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_I)
    o = tl.arange(0, BLOCK_O)

    # cos(π i τ), i = 0..E-1, as `cosine_features` computes it: (π i) first, then times τ   [BM, E]
    tau = tl.load(tau_ptr + row, mask=in_rows, other=0.0)
    pi_i = 3.141592653589793 * e.to(tl.float32)
    features = _layer(tl.cos(pi_i[None, :] * tau[:, None]), ROUND)
    features = tl.where(e[None, :] < embed, features, 0.0)

    # hidden = W_1 (ψ(s') ⊙ relu(W_e cos + b_e)) summed over chunks of BLOCK_H trunk units   [BM, I]
    acc = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    for start in range(0, hidden, BLOCK_H):
        unit = start + u  # [BH]
        in_unit = unit < hidden
        w_e = tl.load(
            embed_w_ptr + unit[None, :] * stride_embed_w + e[:, None],
            mask=in_unit[None, :] & (e[:, None] < embed),
            other=0.0,
        ).to(tl.float32)  # [E, BH]: W_eᵀ
        b_e = tl.load(embed_b_ptr + unit, mask=in_unit, other=0.0).to(tl.float32)
        phi = _dot(features, _layer(w_e, ROUND), DOT_BF16, PRECISION) + _layer(b_e, ROUND)[None, :]
        phi = _relu(_layer(phi, ROUND))  # [BM, BH]
        psi = tl.load(
            h_ptr + sample[:, None] * stride_h + unit[None, :], mask=in_rows[:, None] & in_unit[None, :], other=0.0
        )
        mixed = _layer(psi.to(tl.float32) * phi, ROUND)  # [BM, BH]
        w_1 = tl.load(
            hidden_w_ptr + i[None, :] * stride_hidden_w + unit[:, None],
            mask=(i[None, :] < iqn_hidden) & in_unit[:, None],
            other=0.0,
        ).to(tl.float32)  # [BH, I]: W_1ᵀ
        acc += _dot(mixed, _layer(w_1, ROUND), DOT_BF16, PRECISION)
    b_1 = tl.load(hidden_b_ptr + i, mask=i < iqn_hidden, other=0.0).to(tl.float32)
    hidden = _relu(_layer(acc + _layer(b_1, ROUND)[None, :], ROUND))  # [BM, I]

    # Z_τ'(s', ·) = W_2 hidden + b_2   [BM, K·A]
    outputs = BRANCHES * actions
    w_2 = tl.load(
        out_w_ptr + o[None, :] * stride_out_w + i[:, None],
        mask=(o[None, :] < outputs) & (i[:, None] < iqn_hidden),
        other=0.0,
    ).to(tl.float32)  # [I, O]: W_2ᵀ
    b_2 = tl.load(out_b_ptr + o, mask=o < outputs, other=0.0).to(tl.float32)
    quantiles = _layer(_dot(hidden, _layer(w_2, ROUND), DOT_BF16, PRECISION) + _layer(b_2, ROUND)[None, :], ROUND)

    # r + γ (1 - done) Z_τ'(s', a*) per branch   [BM, K]
    discount = gamma * (1.0 - tl.load(done_ptr + sample, mask=in_rows, other=0.0))
    reward = tl.load(reward_ptr + sample, mask=in_rows, other=0.0)
    for k in tl.static_range(BRANCHES):
        column = k * actions + tl.load(action_ptr + sample * BRANCHES + k, mask=in_rows, other=0)  # [BM]
        z = tl.sum(tl.where(o[None, :] == column[:, None], quantiles, 0.0), axis=1)  # [BM]
        tl.store(target_ptr + row * BRANCHES + k, reward + discount * z, mask=in_rows)


@torch.library.custom_op("foxhunt::iqn_target_quantiles", mutates_args=())
def iqn_target_quantiles(
    tau: Tensor,
    h_next: Tensor,
    layers: list[Tensor],
    a_star: Tensor,
    reward: Tensor,
    done: Tensor,
    gamma: float,
    actions: int,
) -> Tensor:
    """r + γ (1 - done) Z_τ'(s', a*) [B, T', K] float32 of one network's IQN head: tau [B, T'], h_next [B, H] (its
    dtype, bf16 or float32, is the products' precision), `layers` its three layers' weights [out, in] and biases
    [out] in turn (the output layer's rows may be padded past K·A), a_star [B, K] int64, reward and done [B]."""
    embed_w, _, hidden_w, _, out_w, _ = layers
    (batch, taus), branches = tau.shape, a_star.shape[1]
    hidden, embed = embed_w.shape
    iqn_hidden = hidden_w.shape[0]
    if not supports(embed, iqn_hidden, branches * actions):
        raise ValueError(
            f"iqn_target_quantiles: iqn_embed, iqn_hidden and K·A must be at most {IQN_KERNEL_MAX_WIDTH}, got {embed}, "
            f"{iqn_hidden} and {branches * actions}"
        )
    for name, weight in (("embed_w", embed_w), ("hidden_w", hidden_w), ("out_w", out_w), ("h_next", h_next)):
        if weight.stride(-1) != 1:
            raise ValueError(f"iqn_target_quantiles: {name} needs unit stride over its last dim, got {weight.stride()}")
    target = torch.empty(batch, taus, branches, device=tau.device, dtype=torch.float32)
    rows = batch * taus
    # views of the flat parameters in their dtype (bf16 where the step cast them once): no copy, the kernel widens
    weights = [t if t.dim() == 2 else t.contiguous() for t in layers]
    tensors = [tau.float().contiguous(), h_next, *weights, a_star.contiguous(), reward.float().contiguous()]
    tensors += [done.float().contiguous(), target]
    strides = [t.stride(0) for t in (h_next, embed_w, hidden_w, out_w)]
    precision = "ieee" if interpreted() or torch.get_float32_matmul_precision() == "highest" else "tf32"
    _target_quantiles_kernel[(triton.cdiv(rows, ROWS_PER_PROGRAM),)](
        *tensors,
        *strides,
        *(rows, gamma, taus, embed, hidden, iqn_hidden, actions),
        BRANCHES=branches,
        BF16=h_next.dtype == torch.bfloat16,
        PRECISION=precision,
        num_warps=WARPS_PER_PROGRAM,
    )
    return target


def _tile(width: int) -> int:
    """A tile's width: the next power of two, at least 16 (the smallest a product's dimension takes)."""
    return max(16, triton.next_power_of_2(width))


@iqn_target_quantiles.register_fake
def _(tau: Tensor, h_next: Tensor, layers: list[Tensor], a_star: Tensor, *scalars: object) -> Tensor:
    return tau.new_empty(*tau.shape, a_star.shape[1], dtype=torch.float32)


def next_quantile_targets_fused(p: dict[str, Tensor], h_next: Tensor, tau: Tensor, *rest: Any) -> Tensor:
    """`trainer.algo.step.next_quantile_targets` through the kernel, with the same arguments: after tau, a_star,
    reward, done, gamma and the model's dims."""
    a_star, reward, done, gamma, d = rest
    names = ("iqn_embed_w", "iqn_embed_b", "iqn1_w", "iqn1_b", f"iqn2_w{PADDED}", f"iqn2_b{PADDED}")
    return iqn_target_quantiles(tau, h_next, [p[name] for name in names], a_star, reward, done, gamma, d.actions)
