"""The Triton kernels' shared layer arithmetic: products, relu and autocast's bf16 rounding, written so that a kernel
computes a layer as the written form does (`trainer.execution.kernels.iqn`, `trainer.execution.kernels.mlp`), also
in Triton's interpreter, whose bf16 cast truncates."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def round_bf16(x):
    """x rounded to the nearest bfloat16 (ties to even), kept as float32; NaN stays NaN."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))


@triton.jit
def relu(x):
    """relu as torch's: NaN stays NaN (the GPU's max returns the other operand), so the guard sees a poisoned sample."""
    return tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def rounded(x, ROUND: tl.constexpr):
    """A layer's output as autocast leaves it: rounded to bf16 under mixed precision, by the GPU's own cast (ROUND
    1, ties to even) or, in the interpreter, whose cast truncates, by `round_bf16` (ROUND 2); as it is in float32
    (ROUND 0)."""
    if ROUND == 1:
        return x.to(tl.bfloat16).to(tl.float32)
    if ROUND == 2:
        return round_bf16(x)
    return x


@triton.jit
def dot(a, b, DOT_BF16: tl.constexpr, PRECISION: tl.constexpr):
    """a @ b with float32 accumulation: as bf16 tiles (DOT_BF16: a and b hold bf16-exact values) or float32 ones."""
    if DOT_BF16:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), out_dtype=tl.float32)
    return tl.dot(a, b, input_precision=PRECISION, out_dtype=tl.float32)


def tile(width: int) -> int:
    """A tile's width: the next power of two, at least 16 (the smallest a product's dimension takes)."""
    return max(16, triton.next_power_of_2(width))


def round_mode(bf16: bool, interpreter: bool) -> int:
    """`rounded`'s ROUND for a kernel's precision: 0 in float32; under bf16 1 (the GPU's cast) or, in the interpreter,
    whose cast truncates, 2 (written out)."""
    return (2 if interpreter else 1) if bf16 else 0


def float32_precision(interpreter: bool) -> str:
    """`dot`'s PRECISION for float32 tiles: as the step's other products run (TF32 unless torch's float32 matmul
    precision is "highest"), and IEEE in the interpreter."""
    return "ieee" if interpreter or torch.get_float32_matmul_precision() == "highest" else "tf32"
