"""`trainer.execution.kernels.keyed`: the torch form's numbers (`trainer.algo.rng.keyed_values`) in one launch,
through Triton's interpreter on the CPU, compiled for Hopper by Triton's own compiler, and on a GPU captured in a
graph as the plans capture it."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from tests.factories import compiled_without_the_interpreter, needs_gpu, on_the_interpreter
from trainer.algo.rng import (
    NORMAL,
    RANDINT,
    UNIFORM,
    KeyedGenerator,
    keyed_values,
    rows_draw_,
    uniform_,
    words_per_element,
)
from trainer.execution.kernels.keyed import SPAN, keyed_draw_kernel_
from trainer.execution.plans._capture import capture

KINDS = [
    (UNIFORM, torch.float32),
    (UNIFORM, torch.float64),
    (NORMAL, torch.float32),
    (NORMAL, torch.float64),
    (RANDINT, torch.int64),
]


@on_the_interpreter
@pytest.mark.parametrize("count", [1500, 2 * SPAN + 77], ids=["one-span", "spans"])
@pytest.mark.parametrize(("kind", "dtype"), KINDS, ids=[f"{k}-{str(d)[6:]}" for k, d in KINDS])
def test_the_kernel_draws_the_torch_forms_numbers(kind: str, dtype: torch.dtype, count: int) -> None:
    """Through Triton's interpreter (the CPU tests): uniforms and integers bit for bit, normals within an ulp or
    two (each backend's log and cos); rows of other runs (2 of 3, out of order), more elements than a block, or
    than a program's span (three programs a row, the counters advanced by a second launch); each drawn run's
    counter advanced by one, the other's not."""
    keys = torch.tensor([12345, 999, 2**32 - 1], dtype=torch.int64)
    counters = torch.tensor([0, 7, 3], dtype=torch.int64)
    rows = torch.tensor([2, 0])
    out = torch.empty(2, count, dtype=dtype)
    advanced = counters.clone()
    keyed_draw_kernel_(out, keys, advanced, rows, kind, high=5)
    want = keyed_values(keys[rows], counters[rows], count, kind, dtype, high=5)
    if kind == NORMAL:
        torch.testing.assert_close(out, want, rtol=1e-6 if dtype == torch.float32 else 1e-14, atol=1e-6)
    else:
        assert torch.equal(out, want)
    assert advanced.tolist() == [1, 7, 4]


def compile_for_hopper() -> list[list[object]]:
    """Every kind and width of `_keyed_kernel` built for sm_90 by Triton's compiler and ptxas, without a GPU:
    (kind, wide, whether its cubin was built). In a process where Triton compiles (not the interpreter)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from trainer.execution.kernels import keyed

    built = []
    for kind, dtype in KINDS:
        wide = dtype == torch.float64
        out = {torch.float32: "*fp32", torch.float64: "*fp64", torch.int64: "*i64"}[dtype]
        signature = {"out_ptr": out, "key_ptr": "*i64", "counter_ptr": "*i64", "rows_ptr": "*i64"}
        signature |= {"count": "i32", "high": "i32"}
        width = words_per_element(kind, dtype)
        constants = {"KIND": keyed.KINDS[kind], "WIDE": wide, "WIDTH": width, "BLOCK": keyed.BLOCK}
        constants |= {"SPAN": keyed.SPAN, "ADVANCE": True}
        signature |= dict.fromkeys(constants, "constexpr")
        source = ASTSource(keyed._keyed_kernel, signature, constants)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        built.append([kind, wide, len(compiled.asm["cubin"]) > 0])
    signature = {"counter_ptr": "*i64", "rows_ptr": "*i64", "runs": "i32", "BLOCK": "constexpr"}
    advance = ASTSource(keyed._advance_kernel, signature, {"BLOCK": 16})
    compiled = triton.compile(advance, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    built.append(["advance", False, len(compiled.asm["cubin"]) > 0])
    return built


def test_the_kernel_compiles_for_hopper() -> None:
    """What the interpreter lets by (int64 words, float64 normals, a construct the code generator refuses) fails
    here, not on the device."""
    built = compiled_without_the_interpreter(__name__, "compile_for_hopper")
    assert built == [*([k, d == torch.float64, True] for k, d in KINDS), ["advance", False, True]]


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("count", [3000, 66_560], ids=["one-span", "spans"])  # the latter `core`'s step uniforms
@pytest.mark.parametrize(("kind", "dtype"), KINDS, ids=[f"{k}-{str(d)[6:]}" for k, d in KINDS])
def test_on_a_gpu_the_kernel_draws_the_cpu_forms_numbers(kind: str, dtype: torch.dtype, count: int) -> None:
    """Compiled for the GPU: the CPU's torch form's uniforms and integers bit for bit, normals within a few ulps."""
    keys, counters, rows = torch.tensor([7, 2**31 + 5]), torch.tensor([3, 0]), torch.tensor([1, 0])
    out = torch.empty(2, count, dtype=dtype, device="cuda")
    advanced = counters.cuda()
    keyed_draw_kernel_(out, keys.cuda(), advanced, rows.cuda(), kind, high=6)
    want = keyed_values(keys[rows], counters[rows], count, kind, dtype, high=6)
    if kind == NORMAL:
        torch.testing.assert_close(out.cpu(), want, rtol=1e-5 if dtype == torch.float32 else 1e-13, atol=1e-5)
    else:
        assert torch.equal(out.cpu(), want)
    assert advanced.tolist() == [4, 1]


@needs_gpu
@pytest.mark.gpu
def test_captured_keyed_draws_replay_the_eager_draws() -> None:
    """Keyed draws alone, captured as a pack plan captures them (warm-up on the capture stream, then the capture,
    then the warm-up's counters undone): every replay fills its buffers with what the same generators draw eagerly,
    a pack's rows (PER's float64 points, one span, and the step's uniforms, three spans) and a solo generator's
    alike. Without the training step around them: where a keyed packed graph parts from its solo graphs (packs
    round 14), this says whether the draws themselves do."""

    def generators() -> tuple[list[KeyedGenerator], KeyedGenerator]:
        return [KeyedGenerator(seed, "step", "cuda") for seed in range(4)], KeyedGenerator(9, "step", "cuda")

    def draw(pack: list[KeyedGenerator], solo: KeyedGenerator, points: Tensor, step: Tensor, own: Tensor) -> None:
        rows_draw_(points, pack, UNIFORM)
        rows_draw_(step, pack, UNIFORM)
        uniform_(own, solo)

    def buffers() -> tuple[Tensor, Tensor, Tensor]:
        return (
            torch.empty(4, 256, dtype=torch.float64, device="cuda"),
            torch.empty(4, 2 * SPAN + 256, device="cuda"),
            torch.empty(2 * SPAN + 256, device="cuda"),
        )

    pack, solo = generators()
    captured = buffers()
    saved = [g.get_state() for g in [*pack, solo]]
    pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
    graph, _ = capture(lambda: draw(pack, solo, *captured), pool, stream, [*pack, solo])
    for generator, state in zip([*pack, solo], saved, strict=True):
        generator.set_state(state)
    eager_pack, eager_solo = generators()
    eager = buffers()
    for replay in range(3):
        graph.replay()
        draw(eager_pack, eager_solo, *eager)
        torch.cuda.synchronize()
        for name, got, want in zip(("points", "step", "solo"), captured, eager, strict=True):
            assert torch.equal(got, want), f"replay {replay}: the captured {name} draw differs from the eager one"
    assert [int(g.counter) for g in [*pack, solo]] == [6] * 4 + [3]  # two draws a replay of each row, one solo
