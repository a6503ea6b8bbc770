"""Keyed random draws of L runs in one launch: `trainer.algo.rng.keyed_values`, executed as one Triton kernel.

Program (l, s) takes run rows[l]'s elements s·SPAN … (s + 1)·SPAN - 1: it hashes the run's key and counter and fills
its span of row l in blocks of BLOCK. Where a row is one span (a pack's draws: 128–8,448 elements a run in the
market recipe), that program also advances the run's counter: one launch. Where it is longer (`core`'s step
uniforms, 66,560 a run), a row's programs must all read the counter before it moves, so a second, one-program
launch advances the counters after. The words are int64 arithmetic masked to 32 bits, as the torch form computes
them, so uniforms and integers are the same bits on either; normals go through each backend's log and cos (within
an ulp or two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from trainer.algo.rng import NORMAL, RANDINT, UNIFORM, words_per_element

BLOCK = 1024
SPAN = 8 * BLOCK
"""Elements a program: at most eight blocks, so one draw of a large row is spread over the GPU."""
KINDS = {UNIFORM: 0, NORMAL: 1, RANDINT: 2}


@triton.jit
def _pcg(v):
    state = (v * 747796405 + 2891336453) & 0xFFFFFFFF
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & 0xFFFFFFFF
    return (word >> 22) ^ word


@triton.jit
def _word(index, h, g):
    return _pcg((_pcg(index ^ h) + g) & 0xFFFFFFFF)


@triton.jit
def _uniform(e, h, g, WIDTH: tl.constexpr, WIDE: tl.constexpr, J: tl.constexpr):
    """Element e's J-th uniform (of its WIDTH words): 53 bits of two words where WIDE, else 24 of one."""
    if WIDE:
        hi = _word(e * WIDTH + 2 * J, h, g)
        lo = _word(e * WIDTH + 2 * J + 1, h, g)
        return (((hi >> 11) << 32) | lo).to(tl.float64) * 1.1102230246251565e-16
    else:
        return (_word(e * WIDTH + J, h, g) >> 8).to(tl.float32) * 5.960464477539063e-08


@triton.jit
def _keyed_kernel(
    out_ptr, key_ptr, counter_ptr, rows_ptr, count, high,
    KIND: tl.constexpr, WIDE: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr, SPAN: tl.constexpr,
    ADVANCE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    span = tl.program_id(1)
    run = tl.load(rows_ptr + row)
    key = tl.load(key_ptr + run)
    counter = tl.load(counter_ptr + run)
    h = _pcg(key ^ _pcg(counter & 0xFFFFFFFF))
    g = _pcg(h ^ 0x9E3779B9)
    for start in range(span * SPAN, tl.minimum(count, (span + 1) * SPAN), BLOCK):
        e = start + tl.arange(0, BLOCK).to(tl.int64)
        if KIND == 2:
            value = (_word(e * WIDTH, h, g) * high) >> 32
        elif KIND == 1:
            u1 = _uniform(e, h, g, WIDTH, WIDE, 0)
            u2 = _uniform(e, h, g, WIDTH, WIDE, 1)
            value = tl.sqrt(-2.0 * tl.log(1.0 - u1)) * tl.cos(6.283185307179586 * u2)
        else:
            value = _uniform(e, h, g, WIDTH, WIDE, 0)
        tl.store(out_ptr + row * count + e, value, mask=e < count)
    if ADVANCE:
        tl.store(counter_ptr + run, counter + 1)


@triton.jit
def _advance_kernel(counter_ptr, rows_ptr, runs, BLOCK: tl.constexpr):
    """Each of the rows' runs' counters, one on."""
    r = tl.arange(0, BLOCK)
    run = tl.load(rows_ptr + r, mask=r < runs, other=0)
    counter = tl.load(counter_ptr + run, mask=r < runs, other=0)
    tl.store(counter_ptr + run, counter + 1, mask=r < runs)


def keyed_draw_kernel_(out: Tensor, keys: Tensor, counters: Tensor, rows: Tensor, kind: str, high: int = 0) -> Tensor:
    """`trainer.algo.rng.keyed_draw_`: row l of `out` [L, ...] (contiguous) from run rows[l]; one launch where a
    row is one span, else two."""
    if not out.is_contiguous():
        raise ValueError("keyed_draw_kernel_: the output must be contiguous")
    runs = out.shape[0]
    count = out[0].numel() if runs else 0
    spans = max(1, triton.cdiv(count, SPAN))
    _keyed_kernel[(runs, spans)](
        out, keys, counters, rows, count, high,
        KIND=KINDS[kind], WIDE=out.dtype == torch.float64, WIDTH=words_per_element(kind, out.dtype), BLOCK=BLOCK,
        SPAN=SPAN, ADVANCE=spans == 1,
    )  # fmt: skip
    if spans > 1:
        _advance_kernel[(1,)](counters, rows, runs, BLOCK=triton.next_power_of_2(max(runs, 16)))
    return out
