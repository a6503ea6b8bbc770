"""Ways to write three of the step's small batched ops, timed compiled on the GPU, to choose one by measurement.

The bench model's attention runs 4096 problems of 16 × 16 × 32 (B × heads windows of W = 16, head size 32),
and the C51 projection 1024 products of [K, N] × [N, N] (N = 51): far below the tiles that cuDNN's flash
attention and cuBLAS/CUTLASS launch, so their kernels run mostly empty. Each variant here computes the
same values (checked against the first); for each the forward + backward (attention, bf16) or the
forward (projection) is compiled with Inductor and profiled, and its GPU kernel time per call is
printed (the plans run the step as CUDA graphs, so launch time does not count). Measured before (H200,
2026-12-04): attention as `q @ kᵀ` and softmax is pattern-matched back to SDPA (the same kernels), and
as broadcast products and sums it took 263 µs against SDPA's 195.

The third is spectral norm's power iteration over the pinned `core` model's 9 weight matrices (up to 765 × 256):
Inductor's batched form against the one-program-per-matrix Triton kernel (`trainer.execution.kernels.spectral`, with
the autotuner's time for each of its tile configurations), each checked against the per-matrix loop.

The fourth (`--ops iqn`, not among the default ops) is IQN's target quantiles at the `core` size in bf16 (1024 samples
x 32 target taus): the written form compiled by Inductor against the one-kernel form
(`trainer.execution.kernels.iqn`) at several rows and warps per program, each checked against the written form;
`--ops iqnonline` the same for the online pass, forward and backward (the gradient the step takes).

`--ops packgrads` (issue 31) times the weight gradients a pack of 16 market runs takes over long rows (attention's
2,048 and IQN's 1,024 rows a run): `bmm(dyᵀ, x)` per run as autograd batches it under vmap, against the same with
the rows split into S chunks as S times as many batched products and a sum over them (split-K by hand: cuBLAS
splits the rows of one run's product itself, not of a batched one), in float32 with TF32 as the market trains.
`--ops packattn` (issue 31) times the market pack's attention at K = 16, forward and backward: as the pack runs it
(`PackedAttention` on [K, B, h, W, d]: SDPA's math backend, its fused kernels taking 4-D inputs only, and the
gradient written out as products), against SDPA forward and backward over the runs folded into its batch
([K·B, h, W, d], the kernels a solo run's attention takes), one run's SDPA for scale, and attention written out as
batched products or as broadcast sums under torch.compile (Inductor writing both directions, as in the compiled pack:
can it fuse the tiny [16 × 16] × [16 × 8] products that cuBLAS runs as FFMA tiles mostly padded?).

`--ops targetmlp` (issue 32) times the target pass's networks at the `core` size in bf16 (`compute_targets`: trunk and
C51 dueling heads of two networks over 2 x 1024 states): compiled by Inductor against the one kernel
(`trainer.execution.kernels.mlp`) at several rows, warps, pipeline stages and chunks per program.

`--ops priority` (issue 32) times PER's priority write-back at the `core` size (1,024 sampled slots of 1,000,000, some
drawn twice, α = 0.6, float64) compiled: the pairwise max of the powers (the form before 2026-12-07, in whose one
kernel Inductor computed a float64 power for each of the M² pairs: 16 µs of the step on an H100, round 14's timeline)
against the power of the pairwise max (`PrioritizedSampler.update` now), each checked against the other.

    python scripts/bench_small_ops.py [--calls 50] [--ops attention,projection,spectral,iqn,iqnonline,packgrads]
    (`--ops packattn`, `--ops targetmlp`, `--ops priority` likewise)
"""

from __future__ import annotations

import argparse
import collections
import functools
from collections.abc import Callable

import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from trainer.algo.budgets import spectral_project_batched, spectral_project_fused, spectral_project_per_matrix
from trainer.algo.losses.c51 import categorical_projection
from trainer.algo.model import ModelDims, c51_logits, iqn_quantiles, self_attention, trunk
from trainer.algo.replay.sampler import PrioritizedSampler
from trainer.algo.state import TrainState
from trainer.algo.step import next_quantile_targets, quantiles_at
from trainer.execution.kernels import iqn, mlp, spectral
from trainer.execution.kernels.window_attention import window_attention_fused
from trainer.execution.pack import PackedAttention
from trainer.tools.bench import BenchOptions, bench_spec, preset_config, relative_error


def bmm_projection(next_pmf: Tensor, weight: Tensor) -> Tensor:
    return torch.bmm(next_pmf, weight)  # [B, K, N]


def kernel_ms(fn_call: Callable[[], object], calls: int) -> tuple[float, int, list[str]]:
    """GPU kernel time per call (ms), kernels per call, and the kernels' names."""
    for _ in range(3):
        fn_call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn_call()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    names = collections.Counter(e.name[:90] for e in kernels)
    return sum(e.device_time for e in kernels) / 1e3 / calls, len(kernels) // calls, sorted(names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--branches", type=int, default=4)
    parser.add_argument("--atoms", type=int, default=51)
    parser.add_argument("--ops", default="attention,projection,spectral")
    args = parser.parse_args()
    ops = set(args.ops.split(","))
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    generator = torch.Generator(device).manual_seed(0)
    timed_by_calls = {  # the ops timed over --calls calls each; `projection` takes the batch's sizes too
        "spectral": spectral_rows,
        "iqn": iqn_rows,
        "iqnonline": iqn_online_rows,
        "packgrads": pack_gradient_rows,
        "packattn": pack_attention_rows,
        "targetmlp": target_mlp_rows,
        "priority": priority_rows,
    }
    rows = attention_rows(args.batch, args.calls, generator) if "attention" in ops else []
    if "projection" in ops:
        rows += projection_rows(args, generator)
    for op, rows_of in timed_by_calls.items():
        if op in ops:
            rows += rows_of(args.calls, generator)

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.calls} calls")
    for name, ms, count, names in rows:
        print(f"\n{name}: {ms * 1e3:.1f} us, {count} kernels\n    " + "\n    ".join(names))
    print("\nvariant                                          us/call  kernels")
    for name, ms, count, _ in rows:
        print(f"{name:48s} {ms * 1e3:7.1f}  {count:7d}")


Row = tuple[str, float, int, list[str]]


def attention_rows(batch: int, calls: int, generator: torch.Generator) -> list[Row]:
    rows = []
    qkv = torch.randn(batch, 16, 3, 4, 32, device="cuda", generator=generator)  # [B, W, 3, h, d]
    want = self_attention(qkv)
    for name, attend in [("self_attention (SDPA)", self_attention), ("window_attention_fused", window_attention_fused)]:
        torch.testing.assert_close(attend(qkv), want, rtol=1e-4, atol=1e-4)  # float32
        leaf = qkv.to(torch.bfloat16).requires_grad_()
        with torch.no_grad():
            torch.testing.assert_close(attend(leaf).float(), want, rtol=2e-2, atol=2e-2)
        compiled = torch.compile(lambda x, f=attend: f(x).float().square().sum())

        def step(compiled=compiled, leaf=leaf) -> None:
            loss = compiled(leaf)
            loss.backward()
            leaf.grad = None

        rows.append((f"attention fwd+bwd bf16: {name}", *kernel_ms(step, calls)))
    return rows


def projection_rows(args: argparse.Namespace, generator: torch.Generator) -> list[Row]:
    device, rows = torch.device("cuda"), []
    pmf = torch.rand(args.batch, args.branches, args.atoms, device=device, generator=generator).softmax(-1)
    reward = torch.randn(args.batch, device=device, generator=generator)
    done = (torch.rand(args.batch, device=device, generator=generator) < 0.1).float()
    atoms = torch.linspace(-10, 10, args.atoms, device=device)
    want = categorical_projection(pmf, reward, done, 0.99, atoms)
    compiled_projection = torch.compile(categorical_projection)
    torch.testing.assert_close(compiled_projection(pmf, reward, done, 0.99, atoms), want)
    project = lambda: compiled_projection(pmf, reward, done, 0.99, atoms)  # noqa: E731
    rows.append(("projection fwd fp32: categorical_projection", *kernel_ms(project, args.calls)))
    weight = torch.rand(args.batch, args.atoms, args.atoms, device=device, generator=generator)
    compiled_bmm = torch.compile(bmm_projection)
    rows.append(("projection bmm alone (TF32)", *kernel_ms(lambda: compiled_bmm(pmf, weight), args.calls)))
    return rows


def core_state() -> TrainState:
    """The bench's `core` model, freshly initialised on the GPU."""
    config = preset_config("core", BenchOptions())
    spec = bench_spec(config)
    dims = ModelDims.build(config.model, spec.obs_dim, spec.branches, spec.actions)
    return TrainState.create(config, dims, torch.device("cuda"))


def priorities_max_of_powers(sampler: PrioritizedSampler, index: Tensor, loss: Tensor) -> None:
    """`PrioritizedSampler.update` as it was before 2026-12-07: the powers handed to the leaves' write, so that
    compiled its pairwise max takes the max of the powers."""
    p = loss.detach().abs().to(torch.float64) + sampler.eps  # [B]
    p = torch.where(torch.isfinite(p), p, sampler.max_priority)
    sampler._set_leaves(index, p.pow(sampler.alpha), repeats=True)
    sampler.max_priority[...] = torch.maximum(sampler.max_priority, p.max())


def priority_rows(calls: int, generator: torch.Generator) -> list[Row]:
    """The write-back of one `core` step's 1,024 priorities into a replay of 1,000,000 rows, some slots twice."""
    config = preset_config("core", BenchOptions())
    device, batch, capacity = torch.device("cuda"), config.run.batch_size, config.replay.capacity
    index = torch.randint(0, capacity // 512, (batch,), device=device, generator=generator)  # ~a fifth repeat a slot
    loss = torch.rand(batch, device=device, generator=generator) * 10.0
    rows, trees = [], []
    for name, write in [
        ("priority: max of powers (before)", priorities_max_of_powers),
        ("priority: power of the max (now)", PrioritizedSampler.update),
    ]:
        sampler = PrioritizedSampler(
            capacity, device, alpha=config.replay.alpha, beta_start=0.4, beta_end=1.0, total_steps=100, search="cdf"
        )
        sampler.on_write(torch.arange(capacity, device=device), capacity)
        compiled = torch.compile(functools.partial(write, sampler), fullgraph=True)
        compiled(index, loss)
        trees.append(sampler.priorities().clone())
        rows.append((name, *kernel_ms(functools.partial(compiled, index, loss), calls)))
    torch.testing.assert_close(trees[1], trees[0], rtol=1e-15, atol=0.0)
    return rows


def spectral_rows(calls: int, generator: torch.Generator) -> list[Row]:
    """The `core` model's main network, its parameters scaled so that every matrix is projected."""
    rows = []
    state = core_state()
    layout, params = state.main, state.online.detach() * 30.0
    v = state.spectral_v
    want, want_v = spectral_project_per_matrix(params, v, layout, 1.0)
    for name, form in [
        ("spectral: Inductor batched", spectral_project_batched),
        ("spectral: kernel", spectral_project_fused),
    ]:
        compiled = torch.compile(form, dynamic=False)
        got, got_v = compiled(params, v, layout, 1.0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got_v, want_v, rtol=1e-5, atol=1e-6)
        rows.append((name, *kernel_ms(functools.partial(compiled, params, v, layout, 1.0), calls)))
    tuner = spectral._power_step_kernel
    for config, timing in getattr(tuner, "configs_timings", {}).items():  # median, 20th, 80th percentile, ms
        print(f"spectral kernel {config}: {timing[0] * 1e3:.1f} us")
    print(f"spectral kernel chosen: {tuner.best_config}")
    return rows


IQN_TILES = [(32, 4), (64, 4), (64, 8), (128, 4), (128, 8)]
"""(rows, warps) per program of the IQN kernel to time; (64, 8) is its default."""


def iqn_rows(calls: int, generator: torch.Generator) -> list[Row]:
    """The `core` target network's IQN head over bf16 weights cast once, as the step runs it (`network_views`)."""
    device, rows = torch.device("cuda"), []
    state = core_state()
    dims = state.dims
    views = state.main.views(state.target.detach().to(torch.bfloat16))
    batch, taus = BenchOptions().batch_size, dims.iqn_target_taus
    h_next = torch.randn(batch, dims.hidden, device=device, generator=generator).relu().to(torch.bfloat16)
    tau = torch.rand(batch, taus, device=device, generator=generator)
    a_star = torch.randint(0, dims.actions, (batch, dims.branches), device=device, generator=generator)
    reward = torch.randn(batch, device=device, generator=generator)
    done = (torch.rand(batch, device=device, generator=generator) < 0.1).float()
    inputs = (views, h_next, tau, a_star, reward, done, 0.99, dims)

    def written(*args: object) -> Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return next_quantile_targets(*args)  # type: ignore[arg-type]

    compiled = torch.compile(written, dynamic=False)
    want = compiled(*inputs)
    rows.append((f"iqn target bf16 [{batch}x{taus}]: Inductor", *kernel_ms(lambda: compiled(*inputs), calls)))
    default = iqn.ROWS_PER_PROGRAM, iqn.WARPS_PER_PROGRAM
    try:
        for tile in IQN_TILES:
            iqn.ROWS_PER_PROGRAM, iqn.WARPS_PER_PROGRAM = tile
            torch.testing.assert_close(iqn.next_quantile_targets_fused(*inputs), want, rtol=2e-2, atol=2e-2)
            fused = functools.partial(iqn.next_quantile_targets_fused, *inputs)
            rows.append((f"iqn target bf16: kernel, {tile[0]} rows, {tile[1]} warps", *kernel_ms(fused, calls)))
    finally:
        iqn.ROWS_PER_PROGRAM, iqn.WARPS_PER_PROGRAM = default
    return rows


TARGET_MLP_TILES = [
    (32, 4, 2, 32),
    (16, 4, 2, 32),
    (64, 4, 2, 32),
    (64, 8, 2, 32),
    (32, 8, 2, 32),
    (32, 4, 3, 32),
    (32, 4, 1, 32),
    (32, 4, 2, 64),
    (16, 2, 2, 32),
]
"""(rows, warps, stages, chunk) per program of the target pass's kernel to time; (32, 4, 2, 32) is its default (round
24 on an H100: 0.227 ms in the step, which it made 0.135 ms slower)."""


def target_mlp_rows(calls: int, generator: torch.Generator) -> list[Row]:
    """The `core` target pass in bf16, as `compute_targets` runs it: the online and target networks stacked [2, P],
    cast once, over s and s' (2 x 1024 states each): `trunk` then `c51_logits` compiled, against the one kernel
    (`trainer.execution.kernels.mlp`) at several tiles, each checked against the compiled form."""
    device = torch.device("cuda")
    state = core_state()
    dims = state.dims
    both = state.main.views(torch.stack([state.online, state.target]).detach().to(torch.bfloat16))
    states = torch.randn(2 * BenchOptions().batch_size, dims.obs_dim, device=device, generator=generator)
    states = states.expand(2, -1, -1)  # [2, 2B, F]

    def written(both: dict[str, Tensor], states: Tensor) -> tuple[Tensor, Tensor]:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = trunk(both, states)
            return h, c51_logits(both, h, dims)

    compiled = torch.compile(written, dynamic=False)
    want = compiled(both, states)
    rows = [(f"target pass bf16 [2x{states.shape[1]}]: Inductor", *kernel_ms(lambda: compiled(both, states), calls))]
    default = mlp.ROWS_PER_PROGRAM, mlp.WARPS_PER_PROGRAM, mlp.STAGES_PER_PROGRAM, mlp.CHUNK
    try:
        for tile in TARGET_MLP_TILES:
            mlp.ROWS_PER_PROGRAM, mlp.WARPS_PER_PROGRAM, mlp.STAGES_PER_PROGRAM, mlp.CHUNK = tile
            try:
                got = mlp.target_networks(both, states, dims)
            except Exception as error:  # a tile past the shared memory: say so, time the others
                print(f"target pass kernel {tile}: {type(error).__name__}: {str(error)[:120]}")
                continue
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
            fused = functools.partial(mlp.target_networks, both, states, dims)
            name = f"target pass bf16: kernel {tile[0]} rows, {tile[1]} warps, {tile[2]} stages, chunk {tile[3]}"
            rows.append((name, *kernel_ms(fused, calls)))
    finally:
        mlp.ROWS_PER_PROGRAM, mlp.WARPS_PER_PROGRAM, mlp.STAGES_PER_PROGRAM, mlp.CHUNK = default
    return rows


IQN_BACKWARD_TILES = [(128, 128, 8), (64, 128, 8), (128, 64, 8), (128, 128, 4), (256, 128, 8), (256, 64, 8)]
"""(rows a block in bf16, programs a kernel, warps a program) of the online backward's kernels to time; (128, 128, 8)
is their default (round 22 on an H100: 136 µs, against 181 at 64 rows and 187 at 256)."""


def iqn_online_rows(calls: int, generator: torch.Generator) -> list[Row]:
    """The online pass at the `core` size in bf16 (1024 samples x 32 taus), forward and backward: the gradient of
    Σ g ⊙ Z_τ(s, a) with respect to the head's layers and h_s2, as the step takes it (torch.func.grad)."""
    device, rows = torch.device("cuda"), []
    state = core_state()
    dims = state.dims
    views = state.main.views(state.online.detach().to(torch.bfloat16))
    layers = {name: view for name, view in views.items() if name.startswith("iqn")}
    batch, taus = BenchOptions().batch_size, dims.iqn_taus
    h = torch.randn(batch, dims.hidden, device=device, generator=generator).relu().to(torch.bfloat16)
    tau = torch.rand(batch, taus, device=device, generator=generator)
    action = torch.randint(0, dims.actions, (batch, dims.branches), device=device, generator=generator)
    g = torch.randn(batch, taus, dims.branches, device=device, generator=generator)

    def loss(form: Callable[..., Tensor], layers: dict[str, Tensor], h: Tensor) -> Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return (g * form(layers, h, tau, action, dims)).sum()

    def written(p: dict[str, Tensor], h: Tensor, tau: Tensor, action: Tensor, d: ModelDims) -> Tensor:
        return quantiles_at(iqn_quantiles(p, h, tau, d), action)

    forms = {"Inductor": written, "kernels": iqn.quantiles_at_fused}
    grads = {
        name: torch.compile(torch.func.grad(functools.partial(loss, form), argnums=(0, 1)))
        for name, form in forms.items()
    }
    want = grads["Inductor"](layers, h)
    rows.append(
        (f"iqn online fwd+bwd bf16 [{batch}x{taus}]: Inductor", *kernel_ms(lambda: grads["Inductor"](layers, h), calls))
    )
    default = iqn.BACKWARD_ROWS_PER_PROGRAM, iqn.BACKWARD_PROGRAMS, iqn.WARPS_PER_PROGRAM
    try:
        for tile in IQN_BACKWARD_TILES:
            iqn.BACKWARD_ROWS_PER_PROGRAM, iqn.BACKWARD_PROGRAMS, iqn.WARPS_PER_PROGRAM = tile
            got = grads["kernels"](layers, h)
            error = relative_error(got, want)  # bf16: about 1e-3 expected
            assert error < 2e-2, f"the kernels' gradients are {error:.1e} from Inductor's"
            rows_a_block, programs, warps = tile
            name = (
                f"iqn online fwd+bwd bf16: kernels, backward {rows_a_block} rows a block, {programs} programs, "
                f"{warps} warps (error {error:.0e})"
            )
            rows.append((name, *kernel_ms(functools.partial(grads["kernels"], layers, h), calls)))
    finally:
        iqn.BACKWARD_ROWS_PER_PROGRAM, iqn.BACKWARD_PROGRAMS, iqn.WARPS_PER_PROGRAM = default
    return rows


PACK_GRADIENTS = [(16, 2048, 32, 64), (16, 2048, 64, 32), (16, 2048, 96, 32), (16, 1024, 64, 128)]
"""(runs, rows, outputs, inputs) of the long-row weight gradients in the market pack's update at K = 16 (attention's
projections and IQN's hidden layer; `docs/benchmarks/README.md`, packs round 11)."""


def split_k_bmm(dy: Tensor, x: Tensor, chunks: int) -> Tensor:
    """Σ_rows dyᵀ x per run, [R, O, I] from dy [R, rows, O] and x [R, rows, I]: the rows cut into `chunks` runs of
    rows / chunks (views, no copy), one batched product of R · chunks, then the sum over the chunks."""
    runs, rows, outputs = dy.shape
    if rows % chunks:
        raise ValueError(f"{rows} rows do not split into {chunks} chunks")
    per_chunk = rows // chunks
    partial = torch.bmm(
        dy.reshape(runs * chunks, per_chunk, outputs).transpose(1, 2), x.reshape(runs * chunks, per_chunk, -1)
    )
    return partial.view(runs, chunks, outputs, -1).sum(1)


def pack_gradient_rows(calls: int, generator: torch.Generator) -> list[Row]:
    rows = []
    for runs, length, outputs, inputs in PACK_GRADIENTS:
        dy = torch.randn(runs, length, outputs, device="cuda", generator=generator)
        x = torch.randn(runs, length, inputs, device="cuda", generator=generator)
        want = torch.bmm(dy.transpose(1, 2), x)
        forms: dict[str, Callable[[], Tensor]] = {"bmm": functools.partial(split_k_bmm, dy, x, 1)}
        for chunks in (4, 8, 16):
            forms[f"split-K {chunks}"] = functools.partial(split_k_bmm, dy, x, chunks)
        forms["one run's mm"] = functools.partial(torch.mm, dy[0].T, x[0])  # the solo run's product, for scale
        for name, form in forms.items():
            if name != "one run's mm":
                torch.testing.assert_close(form(), want, rtol=1e-2, atol=1e-1)  # TF32
            label = f"pack grad [{runs}x{length}]ᵀ{outputs}x{inputs} {name}"
            rows.append((label, *kernel_ms(form, calls)))
    return rows


PACK_ATTENTION = (16, 128, 4, 16, 8)
"""(runs, batch, heads, window, head size) of the market pack's attention at K = 16 (packs round 13)."""
AS_THE_PACK, FOLDED = "as the pack: 5-D math, written-out gradient", "runs folded: SDPA's kernels both ways"
PRODUCTS, SUMS = "written out as products, compiled", "written out as broadcast sums, compiled"


def attention_forms(
    q: Tensor, k: Tensor, v: Tensor, grad: Tensor, compiled: bool = True
) -> dict[str, Callable[[], list[Tensor]]]:
    """Attention's output and gradients (against `grad`) of q, k, v [K, B, h, W, d], each way `--ops packattn` times:
    name -> a call returning [out, dq, dk, dv], each flattened. `compiled` adds the written-out forms under
    torch.compile."""

    def through(
        attend: Callable[..., Tensor], inputs: tuple[Tensor, ...], upstream: Tensor, fold: bool = False
    ) -> list[Tensor]:
        leaves = [(t.reshape(-1, *t.shape[-3:]) if fold else t).detach().requires_grad_() for t in inputs]
        out = attend(*leaves)
        dq, dk, dv = torch.autograd.grad(out, leaves, upstream.reshape(out.shape))
        return [t.reshape(-1) for t in (out, dq, dk, dv)]

    sdpa = torch.nn.functional.scaled_dot_product_attention
    forms: dict[str, Callable[[], list[Tensor]]] = {
        AS_THE_PACK: functools.partial(through, PackedAttention.apply, (q, k, v), grad),
        FOLDED: functools.partial(through, sdpa, (q, k, v), grad, fold=True),
        "one run's SDPA": functools.partial(through, sdpa, (q[0], k[0], v[0]), grad[0]),
    }
    if compiled:  # Inductor writes the gradient of each (AOTAutograd), as in the compiled pack
        for name, attend in [(PRODUCTS, attention_by_products), (SUMS, attention_by_sums)]:
            forms[name] = functools.partial(through, torch.compile(attend, dynamic=False), (q, k, v), grad)
    return forms


def attention_by_products(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q kᵀ / √d) v as batched products: [..., W, d] each."""
    p = torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1)  # [..., W, W]
    return p @ v


def attention_by_sums(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The same as broadcast products summed: reductions over d and W that Inductor can fuse with the softmax
    (a window of 16 and heads of 8 make a product's tile mostly padding)."""
    s = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) * q.shape[-1] ** -0.5  # [..., W, W]
    p = torch.softmax(s, dim=-1)
    return (p.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2)  # [..., W, d]


def pack_attention_rows(calls: int, generator: torch.Generator) -> list[Row]:
    q, k, v, grad = (torch.randn(*PACK_ATTENTION, device="cuda", generator=generator) for _ in range(4))
    forms = attention_forms(q, k, v, grad)
    want = torch.cat(forms[AS_THE_PACK]())
    for name in (FOLDED, PRODUCTS, SUMS):
        torch.testing.assert_close(torch.cat(forms[name]()), want, rtol=1e-3, atol=1e-3)
    label = f"pack attention fwd+bwd K={PACK_ATTENTION[0]}"
    return [(f"{label}: {name}", *kernel_ms(form, calls)) for name, form in forms.items()]


if __name__ == "__main__":
    main()
