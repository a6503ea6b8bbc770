"""Spectral norm's power iteration for every weight matrix in one Triton kernel, one program per matrix.

The same mathematics as `trainer.budgets.spectral_project_per_matrix`, executed differently. Under
Inductor the batched form (`spectral_project_batched`: the matrices gathered into one zero-padded
[M, R, C] block) still took 8 kernels of the `core` step's 160 (round 13's profile, 29 µs on the
critical stream) and wrote a 1.76 M-element block to read it back: each product and norm is a
reduction over a different axis, so a kernel each. Here program i walks its matrix W_i [R, C] twice,
from the flat parameters where it lies:
  v = Wᵀu / ‖Wᵀu‖    (first pass, v [C] in registers)
  w = W v, σ = ‖w‖    (second pass, w [R] written into the new u)
  u ← w / σ           (the program's own rows, after a barrier)
and writes its scale min(1, σ_max / σ); the caller multiplies each element by its matrix's scale
(Inductor fuses that into the update's last kernel). Float32 throughout.

An opaque custom op (`foxhunt::spectral_power_step`, with a fake for tracing), so Dynamo keeps the update
one graph around it and a CUDA graph records its launch. With TRITON_INTERPRET=1 it runs on the CPU (the
unit tests).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

MAX_COLUMNS = 1024
"""The widest matrix a program takes: its v [C] and a tile of rows stay in registers."""

TILE_CONFIGS = [(8192, 8, 1), (8192, 8, 3), (16384, 16, 1), (16384, 16, 3), (32768, 16, 2)]
"""(elements per tile of rows BLOCK_R × BLOCK_C, warps, tiles in flight) that Triton's autotuner times on the
first call for each shape, keeping the fastest; Triton's interpreter (the CPU tests) cannot time, so there
only the first runs."""


def _configs() -> list[triton.Config]:
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    tiles = TILE_CONFIGS[:1] if interpreted else TILE_CONFIGS
    return [triton.Config({"TILE": tile, "STAGES": stages}, num_warps=warps) for tile, warps, stages in tiles]


def supports(max_cols: int) -> bool:
    return 0 < max_cols <= MAX_COLUMNS


@triton.jit
def _tile(params_ptr, offset, row_stride, rows, cols, r0, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Rows r0 … r0 + BLOCK_R of the matrix [R, C] at `offset` (row stride `row_stride`), 0 outside it."""
    r = r0 + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_C)
    inside = (r < rows)[:, None] & (c < cols)[None, :]
    return tl.load(params_ptr + offset + r[:, None] * row_stride + c[None, :], mask=inside, other=0.0), r, r < rows


@triton.autotune(configs=_configs(), key=["MAX_ROWS", "BLOCK_C"])
@triton.jit
def _power_step_kernel(
    params_ptr,
    u_ptr,
    offset_ptr,
    row_stride_ptr,
    rows_ptr,
    cols_ptr,
    u_start_ptr,
    new_u_ptr,
    scale_ptr,
    sigma_max,
    matrices,
    MAX_ROWS: tl.constexpr,
    ROWS_POW2: tl.constexpr,
    BLOCK_C: tl.constexpr,
    TILE: tl.constexpr,
    STAGES: tl.constexpr,
):
    # The row loops run to the largest matrix's rows, masked past this one's: a bound loaded from memory
    # is not a loop bound Triton's interpreter (the CPU tests) takes, and programs run side by side anyway.
    # Inside the loops, products accumulate per element and are reduced once after them: a reduction across
    # the program's threads in every iteration would serialise the loads.
    BLOCK_R: tl.constexpr = TILE // BLOCK_C
    i = tl.program_id(0)
    offset = tl.load(offset_ptr + i)
    row_stride = tl.load(row_stride_ptr + i)
    rows = tl.load(rows_ptr + i)
    cols = tl.load(cols_ptr + i)
    u_start = tl.load(u_start_ptr + i)

    # v = normalize(Wᵀ u)  [C]
    wt_u = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    for r0 in tl.range(0, MAX_ROWS, BLOCK_R, num_stages=STAGES):
        w, r, in_rows = _tile(params_ptr, offset, row_stride, rows, cols, r0, BLOCK_R, BLOCK_C)
        u = tl.load(u_ptr + u_start + r, mask=in_rows, other=0.0)  # [BLOCK_R]
        wt_u += w * u[:, None]
    y = tl.sum(wt_u, axis=0)  # [BLOCK_C]
    v = y / tl.maximum(tl.sqrt(tl.sum(y * y, axis=0)), 1e-12)

    # w = W v [R] into the new u; σ = ‖W v‖ (= uᵀ W v for u = W v / ‖W v‖)
    squares = tl.zeros([BLOCK_R], dtype=tl.float32)
    for r0 in tl.range(0, MAX_ROWS, BLOCK_R, num_stages=STAGES):
        w, r, in_rows = _tile(params_ptr, offset, row_stride, rows, cols, r0, BLOCK_R, BLOCK_C)
        wv = tl.sum(w * v[None, :], axis=1)  # [BLOCK_R]
        squares += wv * wv
        tl.store(new_u_ptr + u_start + r, wv, mask=in_rows)
    sigma = tl.sqrt(tl.sum(squares, axis=0))

    tl.debug_barrier()  # every thread's w stored before any thread reads its rows back
    r = tl.arange(0, ROWS_POW2)
    wv = tl.load(new_u_ptr + u_start + r, mask=r < rows, other=0.0)
    tl.store(new_u_ptr + u_start + r, wv / tl.maximum(sigma, 1e-12), mask=r < rows)
    # min(1, σ_max / σ), NaN kept (a non-finite matrix stays non-finite for the guard)
    tl.store(scale_ptr + i, tl.minimum(sigma_max / sigma, 1.0, propagate_nan=tl.PropagateNan.ALL))
    if i == 0:
        tl.store(scale_ptr + matrices, 1.0)  # slot M: every element outside the matrices


@torch.library.custom_op("foxhunt::spectral_power_step", mutates_args=())
def spectral_power_step(
    params: Tensor,
    u: Tensor,
    offset: Tensor,
    row_stride: Tensor,
    rows: Tensor,
    cols: Tensor,
    u_start: Tensor,
    sigma_max: float,
    max_rows: int,
    max_cols: int,
) -> tuple[Tensor, Tensor]:
    """Per matrix i of the flat float32 `params` [P] (W_i[r, c] = params[offset_i + r · row_stride_i + c],
    R_i = rows_i ≤ max_rows, C_i = cols_i ≤ max_cols) and its singular-vector estimate u[u_start_i : u_start_i + R_i]:
    scale [M + 1] (min(1, σ_max / σ_i), then 1 for elements outside every matrix) and the new u [ΣR]."""
    if not supports(max_cols):
        raise ValueError(f"spectral_power_step: matrices of at most {MAX_COLUMNS} columns, got {max_cols}")
    matrices = offset.shape[0]
    scale = params.new_empty(matrices + 1)
    new_u = torch.empty_like(u)
    block_c = triton.next_power_of_2(max_cols)
    _power_step_kernel[(matrices,)](
        params,
        u,
        offset,
        row_stride,
        rows,
        cols,
        u_start,
        new_u,
        scale,
        sigma_max,
        matrices,
        MAX_ROWS=max_rows,
        ROWS_POW2=triton.next_power_of_2(max_rows),
        BLOCK_C=block_c,
    )
    return scale, new_u


@spectral_power_step.register_fake
def _(
    params: Tensor,
    u: Tensor,
    offset: Tensor,
    row_stride: Tensor,
    rows: Tensor,
    cols: Tensor,
    u_start: Tensor,
    sigma_max: float,
    max_rows: int,
    max_cols: int,
) -> tuple[Tensor, Tensor]:
    return params.new_empty(offset.shape[0] + 1), torch.empty_like(u)
