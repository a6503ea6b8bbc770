"""The step's first network pass as one Triton kernel (issue 32, "fewer, larger kernels"): the online and target
networks' trunk and C51 dueling heads at s and s' (`trainer.algo.step.compute_targets`), S stacked networks
(S = 2) in one launch, a program per network and block of BLOCK_M states.

The same mathematics as `trainer.algo.model.trunk` then `c51_logits` (`head_hidden`, `output_layer`,
`dueling_logits`), executed differently. Compiled, that chain is five cuBLAS products (F → H, H → H, H → 2h for
the value and advantage streams, h → N, h → K·A·N) with Inductor's pointwise kernels between them (the biases,
relus, casts, the dueling mean), each writing its [S, 2B, ·] activations to memory and reading them back. Here a
program keeps its rows' activations on chip and reads only the weights, in chunks: the first layer over chunks of
BLOCK_F features; the second layer a chunk of BLOCK_U units at a time, each chunk stored (h, which IQN's target
reads) and accumulated into the heads' first layers at once; then per chunk of BLOCK_N atoms the value layer and,
per branch k, the advantage layer as one [BLOCK_M, A·BLOCK_N] tile (the weight rows (k·A + a)·N + n gathered),
viewed as [BLOCK_M, A, BLOCK_N] for the mean over the actions. Every width is padded to a power of two (masked).

Under mixed precision (the weights bf16, as `network_views` casts them) every product takes bf16 inputs with
float32 accumulation; its output is rounded to bf16, the bias added in float32 and rounded again (autocast's bf16
product, then Inductor's add), then the relu; the output layers' values are rounded the same way, then the dueling
combine runs in float32. In float32 the products run as the step's other products do (TF32 unless float32 matmul
precision is "highest"). In Triton's interpreter (the CPU tests) the roundings are written out, as in
`trainer.execution.kernels.iqn` (`trainer.execution.kernels.layers`).

An opaque custom op (`foxhunt::target_mlp`, with a fake for tracing), so Dynamo keeps the target graph whole
around it and a CUDA graph records its launch. It has no vmap rule: a pack of runs (`trainer.execution.pack`)
builds its `Hyper` without it and runs the written form. The fused plans use it when `run.target_mlp_kernel` is
`triton` (`trainer.execution.plans.fused.FusedPlan.hyper`), opt-in: on an H100 (issue 32 round 24,
`docs/benchmarks/README.md`) it took 0.227 ms in the step, whose kernel time grew by 0.212 ms (five kernels fewer),
and `core`'s step 0.914 ms against 0.779: a program's chain of small products runs one after another, one program
an SM. `scripts/bench_small_ops.py --ops targetmlp` times its tiles against Inductor's form.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from contracts.config import TARGET_MLP_KERNEL_MAX_ACTIONS, TARGET_MLP_KERNEL_MAX_WIDTH
from trainer.algo.model import ModelDims
from trainer.execution.kernels import interpreted
from trainer.execution.kernels.layers import dot, float32_precision, relu, round_mode, rounded, tile

ROWS_PER_PROGRAM = 32
"""States a program takes (BLOCK_M): S·2B / 32 programs, 128 at `core` (B = 1024), about an H100's 132 SMs. Its
[32, H] trunk activations and [32, h] head accumulators stay in registers. Round 24 measured this tile only."""
WARPS_PER_PROGRAM = 4
STAGES_PER_PROGRAM = 2
"""Software-pipelining stages of the first two layers' loops; the atoms' loop is not pipelined, since each of its
steps loads K advantage tiles: pipelined too, the float32 kernel asked 248 KB of shared memory at `core`'s widths, past
an H100's 227 KB; so 104 KB (bf16: less), `test_mlp.py` compiles it for Hopper."""
CHUNK = 32
"""Features a step of the first layer's loop (BLOCK_F) and trunk units a step of the second's (BLOCK_U): the
weight tiles a step loads are [32, H] and [H, 32] + 2 × [32, h]."""
ADVANTAGE_COLUMNS = 128
"""The advantage tile's columns (A padded × BLOCK_N), which sets BLOCK_N: 16 atoms a step at `core` (A = 5 → 8)."""


def supports(d: ModelDims) -> bool:
    """Whether a program holds the trunk's and the heads' widths (H, h) each as one tile and A padded × 16 atoms
    as the advantage tile; the features and the atoms are taken in chunks, any number of them."""
    return _fits(d.hidden, d.head_hidden, d.actions)


def _fits(hidden: int, head_hidden: int, actions: int) -> bool:
    return max(hidden, head_hidden) <= TARGET_MLP_KERNEL_MAX_WIDTH and actions <= TARGET_MLP_KERNEL_MAX_ACTIONS


@triton.jit
def _affine(acc, b_ptr, unit, in_unit, ROUND: tl.constexpr):
    """A product's float32 sums `acc` [BM, U] as the layer's output before its relu: rounded, + b, rounded."""
    bias = tl.load(b_ptr + unit, mask=in_unit, other=0.0).to(tl.float32)  # [U]
    return rounded(rounded(acc, ROUND) + bias[None, :], ROUND)


@triton.jit
def _target_mlp_kernel(
    x_ptr,
    w1_ptr,
    b1_ptr,
    w2_ptr,
    b2_ptr,
    wh_ptr,
    bh_ptr,
    wv_ptr,
    bv_ptr,
    wa_ptr,
    ba_ptr,
    h_ptr,
    out_ptr,
    net_x,
    net_w1,
    net_b1,
    net_w2,
    net_b2,
    net_wh,
    net_bh,
    net_wv,
    net_bv,
    net_wa,
    net_ba,
    stride_x,
    stride_w1,
    stride_w2,
    stride_wh,
    stride_wv,
    stride_wa,
    rows,
    features,
    hidden,
    head_hidden,
    atoms,
    actions,
    BRANCHES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_U: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_BF16: tl.constexpr,
    PRECISION: tl.constexpr,
    ROUND: tl.constexpr,
):
    """Network program_id(0)'s h [BM, H] and logits [BM, K, A, N] at block program_id(1)'s states. Each input by its
    network stride `net_*` (0: shared, as the expanded states) and its row stride; h and the logits contiguous."""
    net = tl.program_id(0)
    x_ptr += net * net_x
    w1_ptr, b1_ptr = w1_ptr + net * net_w1, b1_ptr + net * net_b1
    w2_ptr, b2_ptr = w2_ptr + net * net_w2, b2_ptr + net * net_b2
    wh_ptr, bh_ptr = wh_ptr + net * net_wh, bh_ptr + net * net_bh
    wv_ptr, bv_ptr = wv_ptr + net * net_wv, bv_ptr + net * net_bv
    wa_ptr, ba_ptr = wa_ptr + net * net_wa, ba_ptr + net * net_ba
    row = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    in_rows = row < rows
    i = tl.arange(0, BLOCK_H)  # trunk units
    j = tl.arange(0, BLOCK_J)  # head units

    # h1 = relu(x W1ᵀ + b1), over chunks of BLOCK_F features   [BM, H]
    acc = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for start in range(0, features, BLOCK_F):
        f = start + tl.arange(0, BLOCK_F)
        x = tl.load(
            x_ptr + row[:, None] * stride_x + f[None, :], mask=in_rows[:, None] & (f[None, :] < features), other=0.0
        ).to(tl.float32)  # [BM, BF]
        w_1 = tl.load(
            w1_ptr + i[None, :] * stride_w1 + f[:, None],
            mask=(i[None, :] < hidden) & (f[:, None] < features),
            other=0.0,
        ).to(tl.float32)  # [BF, H]: W1ᵀ
        acc += dot(rounded(x, ROUND), w_1, DOT_BF16, PRECISION)
    h1 = relu(_affine(acc, b1_ptr, i, i < hidden, ROUND))

    # per chunk of BLOCK_U units: h2 = relu(h1 W2ᵀ + b2) [BM, BU], stored, and its share of both streams' first
    # layers (the value rows of heads1_w, then the advantage rows)
    value_acc = tl.zeros((BLOCK_M, BLOCK_J), dtype=tl.float32)
    advantage_acc = tl.zeros((BLOCK_M, BLOCK_J), dtype=tl.float32)
    h_rows = h_ptr + (net * rows + row[:, None]) * hidden  # [BM, 1]
    for start in range(0, hidden, BLOCK_U):
        u = start + tl.arange(0, BLOCK_U)
        in_u = u < hidden
        w_2 = tl.load(
            w2_ptr + u[None, :] * stride_w2 + i[:, None], mask=in_u[None, :] & (i[:, None] < hidden), other=0.0
        ).to(tl.float32)  # [H, BU]: W2ᵀ's columns u
        h2 = relu(_affine(dot(h1, w_2, DOT_BF16, PRECISION), b2_ptr, u, in_u, ROUND))  # [BM, BU]
        tl.store(h_rows + u[None, :], h2, mask=in_rows[:, None] & in_u[None, :])
        in_heads = (j[None, :] < head_hidden) & in_u[:, None]
        value_rows = wh_ptr + j[None, :] * stride_wh + u[:, None]  # [BU, h]: the value rows' columns u, transposed
        w_v = tl.load(value_rows, mask=in_heads, other=0.0).to(tl.float32)
        w_a = tl.load(value_rows + head_hidden * stride_wh, mask=in_heads, other=0.0).to(tl.float32)  # advantage's
        value_acc += dot(h2, w_v, DOT_BF16, PRECISION)
        advantage_acc += dot(h2, w_a, DOT_BF16, PRECISION)
    in_j = j < head_hidden
    value_hidden = relu(_affine(value_acc, bh_ptr, j, in_j, ROUND))  # [BM, h]
    advantage_hidden = relu(_affine(advantage_acc, bh_ptr + head_hidden, j, in_j, ROUND))  # [BM, h]

    # per chunk of BLOCK_N atoms: value [BM, BN], then per branch the advantages [BM, A, BN] and the dueling combine
    c = tl.arange(0, BLOCK_A * BLOCK_N)  # the advantage tile's columns: (a, n) = (c // BN, c % BN)
    a = tl.arange(0, BLOCK_A)
    in_actions = (a < actions)[None, :, None]  # [1, A, 1]
    for start in tl.range(0, atoms, BLOCK_N, num_stages=1):  # not pipelined (`STAGES_PER_PROGRAM`)
        n = start + tl.arange(0, BLOCK_N)
        in_n = n < atoms
        value_columns = wv_ptr + n[None, :] * stride_wv + j[:, None]  # [h, BN]: value2ᵀ
        w_v2 = tl.load(value_columns, mask=in_n[None, :] & in_j[:, None], other=0.0).to(tl.float32)
        value = _affine(dot(value_hidden, w_v2, DOT_BF16, PRECISION), bv_ptr, n, in_n, ROUND)  # [BM, BN]
        column_a, column_n = c // BLOCK_N, start + c % BLOCK_N
        in_columns = (column_a < actions) & (column_n < atoms)  # [A·BN]
        for k in tl.static_range(BRANCHES):
            out_row = (k * actions + column_a) * atoms + column_n  # adv2's rows of the tile's columns   [A·BN]
            w_a2 = tl.load(
                wa_ptr + out_row[None, :] * stride_wa + j[:, None],
                mask=in_columns[None, :] & in_j[:, None],
                other=0.0,
            ).to(tl.float32)  # [h, A·BN]: adv2ᵀ's columns of branch k
            advantage = dot(advantage_hidden, w_a2, DOT_BF16, PRECISION)
            advantage = _affine(advantage, ba_ptr, out_row, in_columns, ROUND)  # [BM, A·BN]
            advantage = tl.reshape(advantage, (BLOCK_M, BLOCK_A, BLOCK_N))  # [BM, A, BN]
            mean = tl.sum(tl.where(in_actions, advantage, 0.0), axis=1) / actions  # [BM, BN]: over the real actions
            logits = value[:, None, :] + advantage - mean[:, None, :]  # [BM, A, BN]
            out = ((net * rows + row[:, None, None]) * BRANCHES + k) * actions + a[None, :, None]
            in_out = in_rows[:, None, None] & in_actions & in_n[None, None, :]
            tl.store(out_ptr + out * atoms + n[None, None, :], logits, mask=in_out)


LAYERS = (
    "trunk1_w",
    "trunk1_b",
    "trunk2_w",
    "trunk2_b",
    "heads1_w",
    "heads1_b",
    "value2_w",
    "value2_b",
    "adv2_w",
    "adv2_b",
)
"""The views (`trainer.algo.model.main_layout`) the kernel reads, in its order: of heads1 the first 2·head_hidden rows
(value, then advantage; the ensemble's after them are not read), of value2 and adv2 the real rows."""


@torch.library.custom_op("foxhunt::target_mlp", mutates_args=())
def target_mlp(
    states: Tensor, layers: list[Tensor], head_hidden: int, branches: int, actions: int
) -> tuple[Tensor, Tensor]:
    """`trunk` then `c51_logits` of S stacked networks in one kernel: h [S, M, H] in the layers' dtype (bf16: the
    products' precision) and logits [S, M, K, A, N] float32, of states [S, M, F] (float32, any network stride:
    an expanded tensor is read once) and `layers` (`LAYERS`, each [S, ...] with unit stride over its last dim)."""
    states, weights = states.float(), layers[::2]  # weights: trunk1_w, trunk2_w, heads1_w, value2_w, adv2_w
    nets, rows, features = states.shape
    hidden, atoms = weights[0].shape[1], weights[3].shape[1]
    if not _fits(hidden, head_hidden, actions):
        raise ValueError(
            f"target_mlp: hidden and head_hidden must be at most {TARGET_MLP_KERNEL_MAX_WIDTH} and the actions at "
            f"most {TARGET_MLP_KERNEL_MAX_ACTIONS}, got {hidden}, {head_hidden} and {actions}"
        )
    if len({t.dtype for t in layers}) != 1:
        raise ValueError(f"target_mlp: the layers need one dtype, got {sorted({str(t.dtype) for t in layers})}")
    for name, tensor in zip(("states", *LAYERS), (states, *layers), strict=True):
        if tensor.stride(-1) != 1:
            raise ValueError(f"target_mlp: {name} needs unit stride over its last dim, got {tensor.stride()}")
    h = torch.empty(nets, rows, hidden, device=states.device, dtype=layers[0].dtype)
    logits = torch.empty(nets, rows, branches, actions, atoms, device=states.device, dtype=torch.float32)
    widths = (rows, features, hidden, head_hidden, atoms, actions)  # the kernel's runtime sizes, in its order
    # the layers are views of the flat parameters in their dtype (bf16 where the step cast them once): no copy
    _target_mlp_kernel[(nets, triton.cdiv(rows, ROWS_PER_PROGRAM))](
        states,
        *layers,
        h,
        logits,
        states.stride(0),
        *(t.stride(0) for t in layers),
        states.stride(1),
        *(t.stride(1) for t in weights),
        *widths,
        **launch_constants(
            features, hidden, head_hidden, atoms, branches, actions, layers[0].dtype == torch.bfloat16, interpreted()
        ),
        num_warps=WARPS_PER_PROGRAM,
        num_stages=STAGES_PER_PROGRAM,
    )
    return h, logits


def launch_constants(
    features: int, hidden: int, head_hidden: int, atoms: int, branches: int, actions: int, bf16: bool, interpreter: bool
) -> dict[str, Any]:
    """The kernel's tiles and precision flags for these widths (`test_mlp.py` compiles it with them for Hopper)."""
    block_a = triton.next_power_of_2(actions)
    return {
        "BRANCHES": branches,
        "BLOCK_M": ROWS_PER_PROGRAM,
        "BLOCK_F": min(CHUNK, tile(features)),
        "BLOCK_H": tile(hidden),
        "BLOCK_U": min(CHUNK, tile(hidden)),
        "BLOCK_J": tile(head_hidden),
        "BLOCK_A": block_a,
        "BLOCK_N": min(tile(atoms), max(16, ADVANTAGE_COLUMNS // block_a)),
        "DOT_BF16": bf16 and not interpreter,
        "PRECISION": float32_precision(interpreter),
        "ROUND": round_mode(bf16, interpreter),
    }


@target_mlp.register_fake
def _(states: Tensor, layers: list[Tensor], head_hidden: int, branches: int, actions: int) -> tuple[Tensor, Tensor]:
    nets, rows, _ = states.shape
    w1, wv = layers[0], layers[6]
    h = states.new_empty(nets, rows, w1.shape[1], dtype=w1.dtype)
    return h, states.new_empty(nets, rows, branches, actions, wv.shape[1], dtype=torch.float32)


def target_networks(both: dict[str, Tensor], states: Tensor, d: ModelDims) -> tuple[Tensor, Tensor]:
    """`trunk(both, states)` and `c51_logits(both, h, d)` through the kernel, with the step's arguments: S stacked
    networks' views (`network_views` of [S, P]) and their states [S, M, F]."""
    return target_mlp(states, [both[name] for name in LAYERS], d.head_hidden, d.branches, d.actions)
