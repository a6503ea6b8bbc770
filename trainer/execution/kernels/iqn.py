"""IQN's quantile head as Triton kernels (issue 32): the target quantiles in one kernel (the target network's
head at s' for T' taus, the Double-DQN gather and r + γ(1 - done) Z), and the online pass (the head at s for T taus
at the batch's actions) in a forward and two backward kernels; a program takes blocks of BLOCK_M (sample, tau)
rows.

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
multiplies bf16 tiles wrongly, so there the rounding is written out (`trainer.execution.kernels.layers.round_bf16`)
and the products run in float32 on bf16-exact values, which is the same arithmetic.

The online backward recomputes the activations from the inputs (the forward saves nothing) in two kernels: the
first recomputes each row's hidden layer and stores its gradient, the second takes the trunk's units a chunk at a
time, recomputing only that chunk's φ. Each program sums its share of the weight gradients in registers over many
rows and stores it once; the shares are added in a fixed order and rounded once. (Round 21's single backward
kernel added every program's share atomically, and was 2.2× slower than Inductor's form for it.)

Every op takes its tensors with a leading run dimension R (one network: R = 1) and launches one grid of
(programs, R): under vmap (a pack's runs, `trainer.execution.pack`) the runs are one launch (`_over_runs`).

Opaque custom ops (`foxhunt::iqn_target_quantiles`, `foxhunt::iqn_quantiles_at` and its backward, with fakes for
tracing), so Dynamo keeps the step's graph whole around them and a CUDA graph records their launches; the online
pair under an autograd.Function that torch.func differentiates. The fused plans use them when
`run.iqn_target_kernel` (`trainer.execution.plans.fused.FusedPlan.iqn_kernel_chosen`) and `run.iqn_online_kernel`
say so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch._functorch.autograd_function import VmapInfo

from contracts.config import IQN_KERNEL_MAX_WIDTH
from trainer.algo.model import PADDED
from trainer.execution.kernels import interpreted
from trainer.execution.kernels.layers import dot, float32_precision, relu, round_mode, rounded, tile

ROWS_PER_PROGRAM = 128
"""(sample, tau) rows a program takes: its [128, 64] chunk of φ and [128, 128] hidden accumulator (`core`) stay in
registers, over 8 warps (H100: 31.4 µs at `core`'s bf16 size, 36.4 at 64 rows, 50.3 at 32 with 4 warps; Inductor's
written form 48.4 µs in 7 kernels; `docs/benchmarks/README.md`, issue 32 round 20). Read at each launch, as
WARPS_PER_PROGRAM is, so `scripts/bench_small_ops.py --ops iqn` can time others."""
WARPS_PER_PROGRAM = 8
STAGES_PER_PROGRAM = 2
"""Software-pipelining stages of the kernels' loops. Three (Triton's default) asked for 240 KB of shared memory for
the float32 forward and 256 KB for round 21's backward at `core`'s tiles (Triton 3.7 compiling for sm_90), past an
H100's 227 KB. With two the float32 forward asks for 160 KB and the backward kernels (64 rows) for 136 and 176; in bf16
(128 rows) 32, 44 and 85 KB (`test_iqn.py` compiles them for Hopper)."""
BACKWARD_ROWS_PER_PROGRAM = 128
"""The backward kernels' rows a block in bf16 (float32 takes half, `_backward_rows`): the first holds the block's
hidden layer and its gradient, [128, 128] each at `core`, beside a chunk's. On an H100 (round 22) forward and
backward took 136 µs at 128 rows, 181 at 64 and 187 at 256; in float32 128 rows ask 295 KB of shared memory."""
BACKWARD_PROGRAMS = 128
"""Programs of each backward kernel (a run), about an H100's 132 SMs: each loops over its share of the blocks and
sums its share of the weight gradients in registers. Round 21's backward (one program a block of 64 rows, 512 at
`core`, each adding its share of the 50 K weight gradients atomically) took forward and backward to 332 µs on an
H100 (489 at 32 rows, 202 at 128), against Inductor's 148 µs in 25 kernels (issue 32 round 21)."""


def _backward_rows(bf16: bool) -> int:
    return BACKWARD_ROWS_PER_PROGRAM if bf16 else BACKWARD_ROWS_PER_PROGRAM // 2


def supports(embed: int, iqn_hidden: int, outputs: int) -> bool:
    """Whether a program holds iqn_embed, iqn_hidden and K·A each as one tile (padded to a power of two)."""
    return max(embed, iqn_hidden, outputs) <= IQN_KERNEL_MAX_WIDTH


def _block_h(hidden: int) -> int:
    """Trunk units a chunk: the width the kernels take ψ, φ and W_1 in, a chunk at a time."""
    return min(64, tile(hidden))


def _tiles(rows_per_program: Callable[[bool], int], outputs: bool = True) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """A kernel's tile widths and precision flags, from its arguments (the output layer's only where it has one);
    its rows a program from the module's constants (by precision), read at each launch."""
    tiles = {
        "BLOCK_E": lambda args: tile(args["embed"]),
        "BLOCK_H": lambda args: _block_h(args["hidden"]),
        "BLOCK_I": lambda args: tile(args["iqn_hidden"]),
        "DOT_BF16": lambda args: args["BF16"] and not interpreted(),
        "ROUND": lambda args: round_mode(args["BF16"], interpreted()),
        "BLOCK_M": lambda args: rows_per_program(args["BF16"]),
    }
    if outputs:
        tiles["BLOCK_O"] = lambda args: tile(args["BRANCHES"] * args["actions"])
    return tiles


@triton.jit
def _features(tau_ptr, row, in_rows, e, embed, ROUND: tl.constexpr):
    """cos(π i τ), i = 0..E-1, as `cosine_features` computes it: (π i) first, then times τ   [BM, E]."""
    tau = tl.load(tau_ptr + row, mask=in_rows, other=0.0)
    pi_i = 3.141592653589793 * e.to(tl.float32)
    features = rounded(tl.cos(pi_i[None, :] * tau[:, None]), ROUND)
    return tl.where(e[None, :] < embed, features, 0.0)


@triton.jit
def _mixed_chunk(
    features,
    embed_w_ptr,
    embed_b_ptr,
    h_ptr,
    sample,
    in_rows,
    unit,
    in_unit,
    e,
    embed,
    stride_embed_w,
    stride_h,
    DOT_BF16: tl.constexpr,
    PRECISION: tl.constexpr,
    ROUND: tl.constexpr,
):
    """One chunk of BLOCK_H trunk units: φ = relu(W_e cos + b_e), ψ(s) and ψ ⊙ φ, each [BM, BH]."""
    w_e = tl.load(
        embed_w_ptr + unit[None, :] * stride_embed_w + e[:, None],
        mask=in_unit[None, :] & (e[:, None] < embed),
        other=0.0,
    ).to(tl.float32)  # [E, BH]: W_eᵀ
    b_e = tl.load(embed_b_ptr + unit, mask=in_unit, other=0.0).to(tl.float32)
    phi = dot(features, rounded(w_e, ROUND), DOT_BF16, PRECISION) + rounded(b_e, ROUND)[None, :]
    phi = relu(rounded(phi, ROUND))  # [BM, BH]
    psi = tl.load(
        h_ptr + sample[:, None] * stride_h + unit[None, :], mask=in_rows[:, None] & in_unit[None, :], other=0.0
    ).to(tl.float32)
    return phi, psi, rounded(psi * phi, ROUND)


@triton.jit
def _hidden_layer(
    features,
    embed_w_ptr,
    embed_b_ptr,
    hidden_w_ptr,
    hidden_b_ptr,
    h_ptr,
    sample,
    in_rows,
    e,
    u,
    i,
    embed,
    hidden,
    iqn_hidden,
    stride_embed_w,
    stride_hidden_w,
    stride_h,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_I: tl.constexpr,
    DOT_BF16: tl.constexpr,
    PRECISION: tl.constexpr,
    ROUND: tl.constexpr,
):
    """W_1 (ψ ⊙ φ) + b_1 before its relu, summed over chunks of BLOCK_H trunk units   [BM, I]."""
    acc = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    for start in range(0, hidden, BLOCK_H):
        unit = start + u  # [BH]
        in_unit = unit < hidden
        _, _, mixed = _mixed_chunk(
            features, embed_w_ptr, embed_b_ptr, h_ptr, sample, in_rows, unit, in_unit, e, embed, stride_embed_w,
            stride_h, DOT_BF16, PRECISION, ROUND,
        )  # fmt: skip
        w_1 = tl.load(
            hidden_w_ptr + i[None, :] * stride_hidden_w + unit[:, None],
            mask=(i[None, :] < iqn_hidden) & in_unit[:, None],
            other=0.0,
        ).to(tl.float32)  # [BH, I]: W_1ᵀ
        acc += dot(mixed, rounded(w_1, ROUND), DOT_BF16, PRECISION)
    b_1 = tl.load(hidden_b_ptr + i, mask=i < iqn_hidden, other=0.0).to(tl.float32)
    return rounded(acc + rounded(b_1, ROUND)[None, :], ROUND)


@triton.jit
def _run_inputs(
    run,
    tau_ptr,
    action_ptr,
    h_ptr,
    embed_w_ptr,
    embed_b_ptr,
    hidden_w_ptr,
    hidden_b_ptr,
    run_h,
    run_embed_w,
    run_embed_b,
    run_hidden_w,
    run_hidden_b,
    rows,
    taus,
    BRANCHES: tl.constexpr,
):
    """Both kernels' shared inputs at run `run`: the taus and actions contiguous ([R, B, T], [R, B, K]), ψ and the
    layers by their run strides (0: every run's)."""
    samples = rows // taus
    return (
        tau_ptr + run * rows,
        action_ptr + run * samples * BRANCHES,
        h_ptr + run * run_h,
        embed_w_ptr + run * run_embed_w,
        embed_b_ptr + run * run_embed_b,
        hidden_w_ptr + run * run_hidden_w,
        hidden_b_ptr + run * run_hidden_b,
    )


@triton.jit
def _program_rows(
    tau_ptr,
    h_ptr,
    embed_w_ptr,
    embed_b_ptr,
    hidden_w_ptr,
    hidden_b_ptr,
    stride_h,
    stride_embed_w,
    stride_hidden_w,
    rows,
    taus,
    embed,
    hidden,
    iqn_hidden,
    block,
    BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_I: tl.constexpr,
    DOT_BF16: tl.constexpr,
    PRECISION: tl.constexpr,
    ROUND: tl.constexpr,
):
    """Block `block`'s BLOCK_M (sample, tau) rows (row = b·T + t), which are in range, their samples, their cosine
    features [BM, E] and the hidden layer's output relu(W_1 (ψ ⊙ φ) + b_1) [BM, I]: what the forward and the
    backward's first kernel start from."""
    row = block * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    in_rows = row < rows
    sample = row // taus  # [BM]
    e = tl.arange(0, BLOCK_E)
    features = _features(tau_ptr, row, in_rows, e, embed, ROUND)
    hidden_pre = _hidden_layer(
        features, embed_w_ptr, embed_b_ptr, hidden_w_ptr, hidden_b_ptr, h_ptr, sample, in_rows, e,
        tl.arange(0, BLOCK_H), tl.arange(0, BLOCK_I), embed, hidden, iqn_hidden, stride_embed_w, stride_hidden_w,
        stride_h, BLOCK_M, BLOCK_H, BLOCK_I, DOT_BF16, PRECISION, ROUND,
    )  # fmt: skip
    return row, in_rows, sample, features, relu(hidden_pre)


@triton.heuristics(_tiles(lambda bf16: ROWS_PER_PROGRAM))
@triton.jit
def _quantiles_kernel(
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
    out_ptr,
    stride_h,
    stride_embed_w,
    stride_hidden_w,
    stride_out_w,
    run_h,
    run_embed_w,
    run_embed_b,
    run_hidden_w,
    run_hidden_b,
    run_out_w,
    run_out_b,
    rows,
    taus,
    embed,
    hidden,
    iqn_hidden,
    gamma,
    actions,
    BRANCHES: tl.constexpr,
    TARGET: tl.constexpr,
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
    """Z_τ(s, a) per branch [BM, K] at the actions `action_ptr` holds, or (TARGET) r + γ (1 - done) of it, of run
    program_id(1) (the inputs' run strides `run_*`; the contiguous ones' from the sizes)."""
    run = tl.program_id(1)
    tau_ptr, action_ptr, h_ptr, embed_w_ptr, embed_b_ptr, hidden_w_ptr, hidden_b_ptr = _run_inputs(
        run, tau_ptr, action_ptr, h_ptr, embed_w_ptr, embed_b_ptr, hidden_w_ptr, hidden_b_ptr, run_h, run_embed_w,
        run_embed_b, run_hidden_w, run_hidden_b, rows, taus, BRANCHES,
    )  # fmt: skip
    out_w_ptr, out_b_ptr = out_w_ptr + run * run_out_w, out_b_ptr + run * run_out_b
    reward_ptr, done_ptr = reward_ptr + run * (rows // taus), done_ptr + run * (rows // taus)
    out_ptr += run * rows * BRANCHES
    row, in_rows, sample, _, hidden_out = _program_rows(
        tau_ptr, h_ptr, embed_w_ptr, embed_b_ptr, hidden_w_ptr, hidden_b_ptr, stride_h, stride_embed_w,
        stride_hidden_w, rows, taus, embed, hidden, iqn_hidden, tl.program_id(0), BLOCK_M, BLOCK_E, BLOCK_H,
        BLOCK_I, DOT_BF16, PRECISION, ROUND,
    )  # fmt: skip
    i = tl.arange(0, BLOCK_I)
    o = tl.arange(0, BLOCK_O)

    # Z_τ(s, ·) = W_2 hidden + b_2   [BM, K·A]
    outputs = BRANCHES * actions
    w_2 = tl.load(
        out_w_ptr + o[None, :] * stride_out_w + i[:, None],
        mask=(o[None, :] < outputs) & (i[:, None] < iqn_hidden),
        other=0.0,
    ).to(tl.float32)  # [I, O]: W_2ᵀ
    b_2 = tl.load(out_b_ptr + o, mask=o < outputs, other=0.0).to(tl.float32)
    quantiles = rounded(dot(hidden_out, rounded(w_2, ROUND), DOT_BF16, PRECISION) + rounded(b_2, ROUND)[None, :], ROUND)

    if TARGET:  # r + γ (1 - done) Z_τ'(s', a*)
        discount = gamma * (1.0 - tl.load(done_ptr + sample, mask=in_rows, other=0.0))
        reward = tl.load(reward_ptr + sample, mask=in_rows, other=0.0)
    for k in tl.static_range(BRANCHES):
        column = k * actions + tl.load(action_ptr + sample * BRANCHES + k, mask=in_rows, other=0)  # [BM]
        z = tl.sum(tl.where(o[None, :] == column[:, None], quantiles, 0.0), axis=1)  # [BM]
        if TARGET:
            z = reward + discount * z
        tl.store(out_ptr + row * BRANCHES + k, z, mask=in_rows)


@triton.heuristics(_tiles(_backward_rows))
@triton.jit
def _backward_rows_kernel(
    tau_ptr,
    h_ptr,
    embed_w_ptr,
    embed_b_ptr,
    hidden_w_ptr,
    hidden_b_ptr,
    out_w_ptr,
    action_ptr,
    grad_ptr,
    grad_hidden_ptr,
    partial_ptr,
    stride_h,
    stride_embed_w,
    stride_hidden_w,
    stride_out_w,
    run_h,
    run_embed_w,
    run_embed_b,
    run_hidden_w,
    run_hidden_b,
    run_out_w,
    out_rows,
    rows,
    taus,
    embed,
    hidden,
    iqn_hidden,
    actions,
    steps,
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
    """The backward's first half. Program g of G takes blocks g, g + G, ... (`steps` of them): recomputes each
    block's forward to the hidden layer, stores ∂hidden [BM, I] (through the relu) for the second half, and sums
    the output layer's ∂W_2 = ∂Zᵀ hidden, ∂b_2 = Σ ∂Z and ∂b_1 = Σ ∂hidden over its blocks in registers; its sums
    are stored once, as row g of run program_id(1)'s partial sums [G, out_rows·I + out_rows + I]."""
    run = tl.program_id(1)
    tau_ptr, action_ptr, h_ptr, embed_w_ptr, embed_b_ptr, hidden_w_ptr, hidden_b_ptr = _run_inputs(
        run, tau_ptr, action_ptr, h_ptr, embed_w_ptr, embed_b_ptr, hidden_w_ptr, hidden_b_ptr, run_h, run_embed_w,
        run_embed_b, run_hidden_w, run_hidden_b, rows, taus, BRANCHES,
    )  # fmt: skip
    out_w_ptr, grad_ptr = out_w_ptr + run * run_out_w, grad_ptr + run * rows * BRANCHES
    grad_hidden_ptr += run * rows * iqn_hidden
    i = tl.arange(0, BLOCK_I)
    o = tl.arange(0, BLOCK_O)
    outputs = BRANCHES * actions
    in_i, in_o = i < iqn_hidden, o < outputs
    w_2 = tl.load(
        out_w_ptr + o[:, None] * stride_out_w + i[None, :],
        mask=in_o[:, None] & in_i[None, :],
        other=0.0,
    ).to(tl.float32)  # [O, I]
    grad_out_w = tl.zeros((BLOCK_O, BLOCK_I), dtype=tl.float32)
    grad_out_b = tl.zeros((BLOCK_O,), dtype=tl.float32)
    grad_hidden_b = tl.zeros((BLOCK_I,), dtype=tl.float32)
    for step in range(0, steps):
        block = tl.program_id(0) + step * tl.num_programs(0)  # past the last block: no row in range, adds nothing
        row, in_rows, sample, _, hidden_out = _program_rows(
            tau_ptr, h_ptr, embed_w_ptr, embed_b_ptr, hidden_w_ptr, hidden_b_ptr, stride_h, stride_embed_w,
            stride_hidden_w, rows, taus, embed, hidden, iqn_hidden, block, BLOCK_M, BLOCK_E, BLOCK_H, BLOCK_I,
            DOT_BF16, PRECISION, ROUND,
        )  # fmt: skip

        # ∂/∂Z [BM, K·A]: each branch's gradient at its taken action's column, zero elsewhere
        grad_z = tl.zeros((BLOCK_M, BLOCK_O), dtype=tl.float32)
        for k in tl.static_range(BRANCHES):
            column = k * actions + tl.load(action_ptr + sample * BRANCHES + k, mask=in_rows, other=0)  # [BM]
            g = tl.load(grad_ptr + row * BRANCHES + k, mask=in_rows, other=0.0)  # [BM]
            grad_z += tl.where(o[None, :] == column[:, None], g[:, None], 0.0)
        grad_z = rounded(grad_z, ROUND)

        # the output layer: ∂W_2 = ∂Zᵀ hidden, ∂b_2 = Σ ∂Z; ∂hidden = ∂Z W_2 through the relu, ∂b_1 = Σ ∂hidden
        grad_out_w += dot(tl.trans(grad_z), hidden_out, DOT_BF16, PRECISION)
        grad_out_b += tl.sum(grad_z, axis=0)
        grad_hidden = rounded(dot(grad_z, rounded(w_2, ROUND), DOT_BF16, PRECISION), ROUND)  # [BM, I]
        grad_hidden = tl.where(hidden_out <= 0.0, 0.0, grad_hidden)
        grad_hidden_b += tl.sum(grad_hidden, axis=0)
        tl.store(
            grad_hidden_ptr + row[:, None] * iqn_hidden + i[None, :], grad_hidden, mask=in_rows[:, None] & in_i[None, :]
        )

    size = out_rows * iqn_hidden + out_rows + iqn_hidden
    partial_ptr += (run * tl.num_programs(0) + tl.program_id(0)) * size
    in_rows_o = o < out_rows  # the padding rows' zeros too (`trainer.algo.model.ALIGN` pads to fewer than BLOCK_O)
    tl.store(partial_ptr + o[:, None] * iqn_hidden + i[None, :], grad_out_w, mask=in_rows_o[:, None] & in_i[None, :])
    tl.store(partial_ptr + out_rows * iqn_hidden + o, grad_out_b, mask=in_rows_o)
    tl.store(partial_ptr + out_rows * iqn_hidden + out_rows + i, grad_hidden_b, mask=in_i)


@triton.heuristics(_tiles(_backward_rows, outputs=False))
@triton.jit
def _backward_units_kernel(
    tau_ptr,
    h_ptr,
    embed_w_ptr,
    embed_b_ptr,
    hidden_w_ptr,
    hidden_b_ptr,
    action_ptr,
    grad_hidden_ptr,
    grad_h_ptr,
    partial_ptr,
    stride_h,
    stride_embed_w,
    stride_hidden_w,
    run_h,
    run_embed_w,
    run_embed_b,
    run_hidden_w,
    run_hidden_b,
    rows,
    taus,
    embed,
    hidden,
    iqn_hidden,
    steps,
    BRANCHES: tl.constexpr,
    BF16: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_I: tl.constexpr,
    DOT_BF16: tl.constexpr,
    ROUND: tl.constexpr,
    BLOCK_M: tl.constexpr,
    WHOLE_SAMPLES: tl.constexpr,
):
    """The backward's second half, per chunk program_id(0) of BLOCK_H trunk units: program g of G (program_id(1))
    takes blocks g, g + G, ... (`steps`), recomputes only its chunk's φ and ψ ⊙ φ, reads the first half's ∂hidden,
    and sums its chunk of ∂W_1 = ∂hiddenᵀ (ψ ⊙ φ), ∂W_e = ∂φᵀ cos and ∂b_e = Σ ∂φ (through φ's relu) in registers,
    stored once in row g of run program_id(2)'s partial sums [G, H·E + H + I·H]. ∂ψ = Σ_τ ∂(ψ ⊙ φ) ⊙ φ: stored
    where a block's rows are whole samples (WHOLE_SAMPLES, their taus), else each row's share added."""
    run = tl.program_id(2)
    tau_ptr, action_ptr, h_ptr, embed_w_ptr, embed_b_ptr, hidden_w_ptr, hidden_b_ptr = _run_inputs(
        run, tau_ptr, action_ptr, h_ptr, embed_w_ptr, embed_b_ptr, hidden_w_ptr, hidden_b_ptr, run_h, run_embed_w,
        run_embed_b, run_hidden_w, run_hidden_b, rows, taus, BRANCHES,
    )  # fmt: skip
    grad_hidden_ptr += run * rows * iqn_hidden
    grad_h_ptr += run * (rows // taus) * hidden
    e = tl.arange(0, BLOCK_E)
    i = tl.arange(0, BLOCK_I)
    unit = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BH]
    in_unit, in_i, in_e = unit < hidden, i < iqn_hidden, e < embed
    w_1 = tl.load(
        hidden_w_ptr + i[:, None] * stride_hidden_w + unit[None, :],
        mask=in_i[:, None] & in_unit[None, :],
        other=0.0,
    ).to(tl.float32)  # [I, BH]
    grad_hidden_w = tl.zeros((BLOCK_I, BLOCK_H), dtype=tl.float32)
    grad_embed_w = tl.zeros((BLOCK_H, BLOCK_E), dtype=tl.float32)
    grad_embed_b = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for step in range(0, steps):
        block = tl.program_id(1) + step * tl.num_programs(1)  # past the last block: no row in range, adds nothing
        row = block * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
        in_rows = row < rows
        sample = row // taus
        features = _features(tau_ptr, row, in_rows, e, embed, ROUND)  # [BM, E]
        phi, psi, mixed = _mixed_chunk(
            features, embed_w_ptr, embed_b_ptr, h_ptr, sample, in_rows, unit, in_unit, e, embed, stride_embed_w,
            stride_h, DOT_BF16, PRECISION, ROUND,
        )  # fmt: skip
        grad_hidden = tl.load(
            grad_hidden_ptr + row[:, None] * iqn_hidden + i[None, :], mask=in_rows[:, None] & in_i[None, :], other=0.0
        ).to(tl.float32)  # [BM, I]
        grad_hidden_w += dot(tl.trans(grad_hidden), mixed, DOT_BF16, PRECISION)
        grad_mixed = rounded(dot(grad_hidden, rounded(w_1, ROUND), DOT_BF16, PRECISION), ROUND)  # [BM, BH]
        grad_psi = rounded(grad_mixed * phi, ROUND)  # [BM, BH]: each row's share of its sample's ∂ψ
        if WHOLE_SAMPLES > 0:  # the block holds its samples' every tau: their sums, stored
            samples = block * (BLOCK_M // WHOLE_SAMPLES) + tl.arange(0, BLOCK_M // WHOLE_SAMPLES)
            grad_psi = tl.sum(tl.reshape(grad_psi, (BLOCK_M // WHOLE_SAMPLES, WHOLE_SAMPLES, BLOCK_H)), axis=1)
            in_samples = (samples < rows // taus)[:, None] & in_unit[None, :]
            tl.store(grad_h_ptr + samples[:, None] * hidden + unit[None, :], rounded(grad_psi, ROUND), mask=in_samples)
        else:  # a sample's taus may span blocks: each row adds its share
            in_block = in_rows[:, None] & in_unit[None, :]
            tl.atomic_add(grad_h_ptr + sample[:, None] * hidden + unit[None, :], grad_psi, mask=in_block)
        grad_phi = tl.where(phi <= 0.0, 0.0, rounded(grad_mixed * psi, ROUND))  # [BM, BH]
        grad_embed_w += dot(tl.trans(grad_phi), features, DOT_BF16, PRECISION)
        grad_embed_b += tl.sum(grad_phi, axis=0)

    size = hidden * embed + hidden + iqn_hidden * hidden
    partial_ptr += (run * tl.num_programs(1) + tl.program_id(1)) * size
    tl.store(partial_ptr + unit[:, None] * embed + e[None, :], grad_embed_w, mask=in_unit[:, None] & in_e[None, :])
    tl.store(partial_ptr + hidden * embed + unit, grad_embed_b, mask=in_unit)
    partial_ptr += hidden * embed + hidden
    tl.store(partial_ptr + i[:, None] * hidden + unit[None, :], grad_hidden_w, mask=in_i[:, None] & in_unit[None, :])


# ---- launching: every tensor with a leading run dimension R (1 for one network; a pack's runs under vmap) ----


class _Arguments(NamedTuple):
    """The kernels' arguments after their pointers."""

    row_strides: list[int]  # h, W_e, W_1, W_2
    run_strides: list[int]  # h, W_e, b_e, W_1, b_1, W_2, b_2 (0: a tensor every run shares)
    sizes: list[int]  # rows and taus a run, iqn_embed, the trunk's width, iqn_hidden


def _head_arguments(op: str, h: Tensor, layers: list[Tensor], rows: int, taus: int, outputs: int) -> _Arguments:
    """Refuses what a program cannot hold (`supports`) and rows without unit stride."""
    embed_w, _, hidden_w, _, out_w, _ = layers
    hidden, embed = embed_w.shape[1:]
    iqn_hidden = hidden_w.shape[1]
    if not supports(embed, iqn_hidden, outputs):
        raise ValueError(
            f"{op}: iqn_embed, iqn_hidden and K·A must be at most {IQN_KERNEL_MAX_WIDTH}, got {embed}, {iqn_hidden} "
            f"and {outputs}"
        )
    names = ("embed_w", "embed_b", "hidden_w", "hidden_b", "out_w", "out_b", "h")
    for name, tensor in zip(names, (*layers, h), strict=True):
        if tensor.stride(-1) != 1:
            raise ValueError(f"{op}: {name} needs unit stride over its last dim, got {tensor.stride()}")
    row_strides = [t.stride(1) for t in (h, embed_w, hidden_w, out_w)]
    run_strides = [t.stride(0) for t in (h, *layers)]
    return _Arguments(row_strides, run_strides, [rows, taus, embed, hidden, iqn_hidden])


def _launch_options(h: Tensor, branches: int) -> dict[str, Any]:
    return {
        "BRANCHES": branches,
        "BF16": h.dtype == torch.bfloat16,
        "PRECISION": float32_precision(interpreted()),
        "num_warps": WARPS_PER_PROGRAM,
        "num_stages": STAGES_PER_PROGRAM,
    }


def _quantiles(
    op: str, tau: Tensor, h: Tensor, layers: list[Tensor], action: Tensor, actions: int, target: tuple | None
) -> Tensor:
    """Z_τ(s, a) [R, B, T, K] float32 at `action` [R, B, K], or with `target` (reward, done, gamma)
    r + γ (1 - done) Z: one launch for the R runs."""
    (runs, batch, taus), branches = tau.shape, action.shape[2]
    rows = batch * taus
    arguments = _head_arguments(op, h, layers, rows, taus, branches * actions)
    out = torch.empty(runs, batch, taus, branches, device=tau.device, dtype=torch.float32)
    reward, done, gamma = target if target is not None else (out, out, 1.0)  # unread without TARGET
    # the layers are views of the flat parameters in their dtype (bf16 where the step cast them once): no copy,
    # the kernels widen them as they load them
    _quantiles_kernel[(triton.cdiv(rows, ROWS_PER_PROGRAM), runs)](
        tau.float().contiguous(),
        h,
        *layers,
        action.contiguous(),
        reward.float().contiguous(),
        done.float().contiguous(),
        out,
        *arguments.row_strides,
        *arguments.run_strides,
        *arguments.sizes,
        gamma,
        actions,
        TARGET=target is not None,
        **_launch_options(h, branches),
    )
    return out


def _over_runs(info: VmapInfo, in_dims: tuple[Any, ...], op: Any, *args: Any) -> tuple[Any, Any]:
    """A vmap rule of the ops below: vmap's dimension V before each tensor's run dimension R, then V·R runs in one
    launch (a pack's runs, `trainer.execution.pack`), the outputs back as [V, R, ...]. A tensor without V is each
    run's (expanded, no copy); a list of tensors (the layers) is batched as each of its tensors is."""

    def with_runs(arg: Any, dim: Any) -> Any:
        if isinstance(arg, list):
            return [
                with_runs(t, d)
                for t, d in zip(arg, dim if isinstance(dim, list | tuple) else [dim] * len(arg), strict=True)
            ]
        if not isinstance(arg, Tensor):
            return arg
        arg = arg.movedim(dim, 0) if dim is not None else arg.expand(info.batch_size, *arg.shape)
        return arg.flatten(0, 1)  # [V·R, ...]

    out = op(*(with_runs(arg, dim) for arg, dim in zip(args, in_dims, strict=True)))
    back = lambda t: t.unflatten(0, (info.batch_size, -1))  # noqa: E731
    return ([back(t) for t in out], [0] * len(out)) if isinstance(out, list) else (back(out), 0)


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
    """r + γ (1 - done) Z_τ'(s', a*) [R, B, T', K] float32 of R networks' IQN heads: tau [R, B, T'], h_next
    [R, B, H] (its dtype, bf16 or float32, is the products' precision), `layers` the three layers' weights
    [R, out, in] and biases [R, out] in turn (the output layer's rows may be padded past K·A), a_star [R, B, K]
    int64, reward and done [R, B]."""
    return _quantiles("iqn_target_quantiles", tau, h_next, layers, a_star, actions, (reward, done, gamma))


@iqn_target_quantiles.register_fake
def _(tau: Tensor, h_next: Tensor, layers: list[Tensor], a_star: Tensor, *scalars: object) -> Tensor:
    return tau.new_empty(*tau.shape, a_star.shape[-1], dtype=torch.float32)


@iqn_target_quantiles.register_vmap
def _(info: VmapInfo, in_dims: tuple[Any, ...], *args: Any) -> tuple[Any, Any]:
    return _over_runs(info, in_dims, iqn_target_quantiles, *args)


def _head_layers(p: dict[str, Tensor]) -> list[Tensor]:
    """The IQN head's three layers, weights and biases in turn, the output layer padded as the products run it,
    each with a run dimension of one."""
    names = ("iqn_embed_w", "iqn_embed_b", "iqn1_w", "iqn1_b", f"iqn2_w{PADDED}", f"iqn2_b{PADDED}")
    return [p[name][None] for name in names]


def next_quantile_targets_fused(p: dict[str, Tensor], h_next: Tensor, tau: Tensor, *rest: Any) -> Tensor:
    """`trainer.algo.step.next_quantile_targets` through the kernel, with the same arguments: after tau, a_star,
    reward, done, gamma and the model's dims."""
    a_star, reward, done, gamma, d = rest
    one = (t[None] for t in (tau, h_next))
    return iqn_target_quantiles(*one, _head_layers(p), a_star[None], reward[None], done[None], gamma, d.actions)[0]


# ---- the online pass: Z_τ(s, a) at the batch's actions, with its gradient ----


@torch.library.custom_op("foxhunt::iqn_quantiles_at", mutates_args=())
def iqn_quantiles_at(tau: Tensor, h: Tensor, layers: list[Tensor], action: Tensor, actions: int) -> Tensor:
    """Z_τ(s, a) [R, B, T, K] float32 of R networks' IQN heads at the actions a [R, B, K] (`iqn_target_quantiles`'
    arguments otherwise)."""
    return _quantiles("iqn_quantiles_at", tau, h, layers, action, actions, None)


@iqn_quantiles_at.register_fake
def _(tau: Tensor, h: Tensor, layers: list[Tensor], action: Tensor, actions: int) -> Tensor:
    return tau.new_empty(*tau.shape, action.shape[-1], dtype=torch.float32)


@iqn_quantiles_at.register_vmap
def _(info: VmapInfo, in_dims: tuple[Any, ...], *args: Any) -> tuple[Any, Any]:
    return _over_runs(info, in_dims, iqn_quantiles_at, *args)


@torch.library.custom_op("foxhunt::iqn_quantiles_at_backward", mutates_args=())
def iqn_quantiles_at_backward(
    grad: Tensor, tau: Tensor, h: Tensor, layers: list[Tensor], action: Tensor, actions: int
) -> list[Tensor]:
    """∂/∂h [R, B, H] and ∂/∂ every one of `layers` of Σ grad ⊙ Z_τ(s, a) (grad [R, B, T, K]), in h's and the
    layers' dtype (one for all of them), the latter flat [R, total] (`_layer_gradients` views it as each layer's):
    the float32 sums over all rows rounded once, as a bf16 product's float32 accumulation is. Two kernels, each
    program summing its share of the weight gradients in registers; the programs' partial sums are then added in a
    fixed order (`torch.sum`), so the gradients are the same from call to call."""
    if len({t.dtype for t in layers}) != 1:
        raise ValueError(f"iqn_quantiles_at_backward: the layers need one dtype, got {[t.dtype for t in layers]}")
    (runs, batch, taus), branches = tau.shape, action.shape[2]
    rows = batch * taus
    arguments = _head_arguments("iqn_quantiles_at_backward", h, layers, rows, taus, branches * actions)
    embed_w, _, hidden_w, _, out_w, _ = layers
    hidden, embed = embed_w.shape[1:]
    iqn_hidden, out_rows = hidden_w.shape[1], out_w.shape[1]
    device, options = tau.device, _launch_options(h, branches)
    inputs = (tau.float().contiguous(), h, *layers[:4])  # τ, ψ and the first two layers, as both kernels take them
    rows_a_block = _backward_rows(h.dtype == torch.bfloat16)
    blocks = triton.cdiv(rows, rows_a_block)
    chunks = triton.cdiv(hidden, _block_h(hidden))
    row_groups = min(blocks, BACKWARD_PROGRAMS)
    unit_groups = min(blocks, max(1, BACKWARD_PROGRAMS // chunks))

    grad_hidden = torch.empty(runs, rows, iqn_hidden, device=device, dtype=h.dtype)  # bf16 values where h is bf16
    first = torch.empty(runs, row_groups, out_rows * iqn_hidden + out_rows + iqn_hidden, device=device)
    _backward_rows_kernel[(row_groups, runs)](
        *inputs,
        out_w,
        action.contiguous(),
        grad.float().contiguous(),
        grad_hidden,
        first,
        *arguments.row_strides,
        *arguments.run_strides[:6],  # not the output bias's: the backward never reads b_2
        out_rows,
        *arguments.sizes,
        actions,
        triton.cdiv(blocks, row_groups),
        **options,
    )
    whole = taus if rows_a_block % taus == 0 else 0  # a block's rows are whole samples
    grad_h = torch.empty(h.shape, device=device, dtype=h.dtype) if whole else torch.zeros(h.shape, device=device)
    second = torch.empty(runs, unit_groups, hidden * embed + hidden + iqn_hidden * hidden, device=device)
    _backward_units_kernel[(chunks, unit_groups, runs)](
        *inputs,
        action.contiguous(),
        grad_hidden,
        grad_h,
        second,
        *arguments.row_strides[:3],
        *arguments.run_strides[:5],
        *arguments.sizes,
        triton.cdiv(blocks, unit_groups),
        WHOLE_SAMPLES=whole,
        **options,
    )
    # one float32 tensor of every layer's sums (`_layer_gradients` has its order), rounded once: three launches
    sums = torch.empty(runs, first.shape[2] + second.shape[2], device=device)
    torch.sum(first, 1, out=sums[:, : first.shape[2]])
    torch.sum(second, 1, out=sums[:, first.shape[2] :])
    return [grad_h.to(h.dtype), sums.to(layers[0].dtype)]


def _layer_gradients(flat: Tensor, layers: Sequence[Tensor]) -> list[Tensor]:
    """Each layer's gradient [R, ...], a view of `iqn_quantiles_at_backward`'s flat sums [R, total]: the first
    kernel's (∂W_2, ∂b_2, ∂b_1), then the second's (∂W_e, ∂b_e, ∂W_1)."""
    embed_w, embed_b, hidden_w, hidden_b, out_w, out_b = layers
    sizes = [t[0].numel() for t in (out_w, out_b, hidden_b, embed_w, embed_b, hidden_w)]
    grad_out_w, grad_out_b, grad_hidden_b, grad_embed_w, grad_embed_b, grad_hidden_w = flat.split(sizes, -1)
    grads = (grad_embed_w, grad_embed_b, grad_hidden_w, grad_hidden_b, grad_out_w, grad_out_b)  # as `layers`
    return [g.view(*flat.shape[:-1], *t.shape[1:]) for g, t in zip(grads, layers, strict=True)]


@iqn_quantiles_at_backward.register_fake
def _(grad: Tensor, tau: Tensor, h: Tensor, layers: list[Tensor], *rest: object) -> list[Tensor]:
    total = sum(t[0].numel() for t in layers)
    return [torch.empty_like(h), h.new_empty(h.shape[0], total, dtype=layers[0].dtype)]


@iqn_quantiles_at_backward.register_vmap
def _(info: VmapInfo, in_dims: tuple[Any, ...], *args: Any) -> tuple[Any, Any]:
    return _over_runs(info, in_dims, iqn_quantiles_at_backward, *args)


class _QuantilesAt(torch.autograd.Function):
    """The forward kernel with the backward kernels as its derivative, the layers as separate inputs (each gets its
    gradient); `setup_context`, so torch.func's grad and Dynamo take it (as `window_attention`'s), and a vmap rule
    made of the ops' (a pack's runs)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(tau: Tensor, h: Tensor, *rest: Any) -> Tensor:  # type: ignore[override]
        *layers, action, actions = rest
        return iqn_quantiles_at(tau, h, list(layers), action, actions)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        tau, h, *rest = inputs
        *layers, action, actions = rest
        ctx.save_for_backward(tau, h, *layers, action)
        ctx.actions = actions

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        tau, h, *layers, action = ctx.saved_tensors
        with torch.no_grad():  # no second derivative: torch.func.grad would otherwise trace through the op
            grad_h, flat = iqn_quantiles_at_backward(grad, tau, h, layers, action, ctx.actions)
        return (None, grad_h, *_layer_gradients(flat, layers), None, None)


def quantiles_at_fused(p: dict[str, Tensor], h_s2: Tensor, tau: Tensor, action: Tensor, d: Any) -> Tensor:
    """`quantiles_at(iqn_quantiles(p, h_s2, tau, d), action)` [B, T, K] through the kernels, differentiable with
    respect to h_s2 and the head's layers."""
    out: Tensor = _QuantilesAt.apply(tau[None], h_s2[None], *_head_layers(p), action[None], d.actions)
    return out[0]
