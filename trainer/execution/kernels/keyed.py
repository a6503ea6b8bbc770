"""Keyed random draws of L runs in one launch: `trainer.algo.rng.keyed_values`, executed as one Triton kernel.

Program l takes run rows[l]: it hashes that run's key and counter once, fills row l of the output in blocks of
BLOCK elements, then advances the counter; it alone reads and writes that run's counter, so no program waits for
another. The words are int64 arithmetic masked to 32 bits, as the torch form computes them, so uniforms and
integers are the same bits on either; normals go through each backend's log and cos (within an ulp or two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from trainer.algo.rng import NORMAL, RANDINT, UNIFORM, words_per_element

BLOCK = 1024
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
    KIND: tl.constexpr, WIDE: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    run = tl.load(rows_ptr + row)
    key = tl.load(key_ptr + run)
    counter = tl.load(counter_ptr + run)
    h = _pcg(key ^ _pcg(counter & 0xFFFFFFFF))
    g = _pcg(h ^ 0x9E3779B9)
    for start in range(0, count, BLOCK):
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
    tl.store(counter_ptr + run, counter + 1)


def keyed_draw_kernel_(out: Tensor, keys: Tensor, counters: Tensor, rows: Tensor, kind: str, high: int = 0) -> Tensor:
    """`trainer.algo.rng.keyed_draw_` in one launch: row l of `out` [L, ...] (contiguous) from run rows[l]."""
    if not out.is_contiguous():
        raise ValueError("keyed_draw_kernel_: the output must be contiguous")
    wide = out.dtype == torch.float64
    count = out[0].numel() if out.shape[0] else 0
    _keyed_kernel[(out.shape[0],)](
        out, keys, counters, rows, count, high,
        KIND=KINDS[kind], WIDE=wide, WIDTH=words_per_element(kind, out.dtype), BLOCK=BLOCK,
    )  # fmt: skip
    return out
