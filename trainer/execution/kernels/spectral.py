"""Spectral norm's power iteration for every weight matrix in one Triton kernel, its rows spread over programs.

The same mathematics as `trainer.algo.budgets.spectral_project_per_matrix`, executed differently. Under Inductor
the batched form (`spectral_project_batched`: the matrices gathered into one zero-padded [M, R, C] block)
took 8 kernels of the `core` step's 160 (round 13's profile, 29 µs on the critical stream): each product
and norm is a reduction over another axis, so a kernel each. One program per matrix walking it twice took
62-90 µs (round 13, H100 and H200): one SM cannot stream the 765 × 128 head fast enough.

Here program (i, s) takes rows s·BLOCK_R … of matrix W_i [R, C], in one pass over them:
  w = W v              (its rows of w, from the carried right singular vector v [C])
  ‖w‖² and Wᵀ w        (its share of each, written to scratch)
and the program of matrix i that arrives last (an atomic counter per matrix, reset by that program) sums
the shares in a fixed order: σ = ‖w‖, the next v = normalize(Wᵀ w), and the scale min(1, σ_max / σ), which
the caller multiplies into each element (Inductor fuses that into the update's last kernel). No program
waits for another, so no grid is too large; Triton's interpreter (the CPU tests) runs the programs one
after another, and the last is the last there too. Float32 throughout.

An opaque custom op (`foxhunt::spectral_power_step`, with a fake for tracing), so Dynamo keeps the update
one graph around it and a CUDA graph records its launch. The caller owns the counters (one int32 per matrix,
zero between calls; `trainer.algo.budgets` keeps them with the matrices' index tables, made while Dynamo traces,
so never inside a CUDA graph's memory pool): two calls at once with the same counters would mix up, which
the step never does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from trainer.execution.kernels import interpreted

MAX_COLUMNS = 1024
"""The widest matrix a program takes: its v [C] and a tile of its rows stay in registers."""

TILE_CONFIGS = [(32, 4), (32, 8), (64, 8), (16, 4)]
"""(rows per program BLOCK_R, warps) that Triton's autotuner times on the first call for each shape, keeping
the fastest; Triton's interpreter (the CPU tests) cannot time, so there only the first runs."""


def _configs() -> list[triton.Config]:
    tiles = TILE_CONFIGS[:1] if interpreted() else TILE_CONFIGS
    return [triton.Config({"BLOCK_R": rows}, num_warps=warps) for rows, warps in tiles]


def supports(max_cols: int) -> bool:
    return 0 < max_cols <= MAX_COLUMNS


@triton.autotune(configs=_configs(), key=["MAX_ROWS", "BLOCK_C"])
@triton.jit
def _power_step_kernel(
    params_ptr,
    v_ptr,
    offset_ptr,
    row_stride_ptr,
    rows_ptr,
    cols_ptr,
    v_start_ptr,
    new_v_ptr,
    scale_ptr,
    share_ptr,
    square_share_ptr,
    counter_ptr,
    sigma_max,
    matrices,
    MAX_ROWS: tl.constexpr,
    ROWS_POW2: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    SHARES: tl.constexpr = (MAX_ROWS + BLOCK_R - 1) // BLOCK_R  # programs per matrix: the grid's second axis
    i = tl.program_id(0)
    s = tl.program_id(1)
    offset = tl.load(offset_ptr + i)
    row_stride = tl.load(row_stride_ptr + i)
    rows = tl.load(rows_ptr + i)
    cols = tl.load(cols_ptr + i)
    v_start = tl.load(v_start_ptr + i)

    # this program's rows of W [BLOCK_R, C] (0 past the matrix), and v [C]
    r = s * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_C)
    in_cols = c < cols
    inside = (r < rows)[:, None] & in_cols[None, :]
    w = tl.load(params_ptr + offset + r[:, None] * row_stride + c[None, :], mask=inside, other=0.0)
    v = tl.load(v_ptr + v_start + c, mask=in_cols, other=0.0)
    wv = tl.sum(w * v[None, :], axis=1)  # [BLOCK_R] rows of W v
    share = (i * SHARES + s) * BLOCK_C
    tl.store(share_ptr + share + c, tl.sum(w * wv[:, None], axis=0))  # [BLOCK_C] its share of Wᵀ (W v)
    tl.store(square_share_ptr + i * SHARES + s, tl.sum(wv * wv, axis=0))  # its share of ‖W v‖²

    # Every thread's shares written before one thread counts this program in (release), and the count read
    # (acquire) before any thread reads the others' shares.
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr + i, 1, sem="acq_rel", scope="gpu")
    last = arrived == SHARES - 1
    tl.debug_barrier()
    # Only the last program reads (the others' loads are masked off); in a fixed order, so deterministic.
    j = tl.arange(0, ROWS_POW2)  # ROWS_POW2 ≥ SHARES for any BLOCK_R ≥ 1
    squares = tl.load(square_share_ptr + i * SHARES + j, mask=(j < SHARES) & last, other=0.0, cache_modifier=".cg")
    sigma = tl.sqrt(tl.sum(squares, axis=0))
    wt_wv = tl.zeros([BLOCK_C], dtype=tl.float32)
    for k in range(SHARES):
        wt_wv += tl.load(share_ptr + (i * SHARES + k) * BLOCK_C + c, mask=last, other=0.0, cache_modifier=".cg")
    # Wᵀ u = Wᵀ (W v) / σ: the same direction, so normalize(Wᵀ (W v)) is the next v
    new_v = wt_wv / tl.maximum(tl.sqrt(tl.sum(wt_wv * wt_wv, axis=0)), 1e-12)
    tl.store(new_v_ptr + v_start + c, new_v, mask=in_cols & last)
    # min(1, σ_max / σ), NaN kept (a non-finite matrix stays non-finite for the guard)
    scale = tl.minimum(sigma_max / tl.where(last, sigma, 1.0), 1.0, propagate_nan=tl.PropagateNan.ALL)
    tl.store(scale_ptr + i, scale, mask=last)
    tl.store(scale_ptr + matrices, 1.0, mask=last & (i == 0))  # slot M: every element outside the matrices
    tl.store(counter_ptr + i, 0, mask=last)  # every program of this call has arrived: zero for the next


@torch.library.custom_op("foxhunt::spectral_power_step", mutates_args=())
def spectral_power_step(
    params: Tensor,
    v: Tensor,
    offset: Tensor,
    row_stride: Tensor,
    rows: Tensor,
    cols: Tensor,
    v_start: Tensor,
    counters: Tensor,
    sigma_max: float,
    max_rows: int,
    max_cols: int,
) -> tuple[Tensor, Tensor]:
    """Per matrix i of the flat float32 `params` [P] (W_i[r, c] = params[offset_i + r · row_stride_i + c],
    R_i = rows_i ≤ max_rows, C_i = cols_i ≤ max_cols) and its right singular-vector estimate
    v[v_start_i : v_start_i + C_i], with `counters` [M] int32 zeros (left at zero): scale [M + 1]
    (min(1, σ_max / σ_i), then 1 for elements outside every matrix) and the next v [ΣC]."""
    if not supports(max_cols):
        raise ValueError(f"spectral_power_step: matrices of at most {MAX_COLUMNS} columns, got {max_cols}")
    matrices = offset.shape[0]
    block_c = triton.next_power_of_2(max_cols)
    most_shares = triton.cdiv(max_rows, min(rows for rows, _ in TILE_CONFIGS))  # scratch for any config
    scale = params.new_empty(matrices + 1)
    new_v = torch.empty_like(v)
    _power_step_kernel[lambda meta: (matrices, triton.cdiv(max_rows, meta["BLOCK_R"]))](
        params,
        v,
        offset,
        row_stride,
        rows,
        cols,
        v_start,
        new_v,
        scale,
        params.new_empty(matrices * most_shares * block_c),  # each program's share of Wᵀ W v
        params.new_empty(matrices * most_shares),  # and of ‖W v‖²
        counters,
        sigma_max,
        matrices,
        MAX_ROWS=max_rows,
        ROWS_POW2=triton.next_power_of_2(max_rows),
        BLOCK_C=block_c,
    )
    return scale, new_v


@spectral_power_step.register_fake
def _(params: Tensor, v: Tensor, offset: Tensor, *layout_and_sizes: object) -> tuple[Tensor, Tensor]:
    return params.new_empty(offset.shape[0] + 1), torch.empty_like(v)
