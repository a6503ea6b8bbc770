"""Where a plan's step time goes on the GPU: kernels per step, busy time, and the costliest kernels.

Usage: python scripts/profile_step.py [--preset core] [--variant NAME ...] [--steps 20]
A variant is a bench method (a plan name or "compile", with an optional precision suffix as in the
bench: "zerocopy-bf16", or with the bench's "+combo": "zerocopy-bf16+combo") with optional flags:
"+tree" (sum-tree sampling instead of the bench's cumulative-sum search), e.g. "zerocopy-bf16+tree";
"+combo16" (up to 16 kernels in one of Inductor's combined kernels
instead of its default 8), e.g. "zerocopy-bf16+combo+combo16"; "+allcombo" (every combined kernel kept,
not only those Inductor's benchmark finds faster); "+nosplitred" (no reduction split into two kernels,
partial and final: Inductor's `split_reductions` off); "+autotune" (each product timed at compile time
among cuBLAS and Inductor's Triton GEMM templates, which can take the product's pointwise epilogue: Inductor's
`max_autotune_gemm`); "+tritongemm" (every product one of those templates); "+pdl" (Inductor's Triton kernels
launched with Hopper's programmatic dependent launch: each starts while the kernel before it finishes and waits
in-kernel before its first read of that kernel's output, `triton.enable_pdl`; round 18: 1% slower); "+iqnk" (IQN's
target quantiles as one Triton kernel, `run.iqn_target_kernel=triton`: under bf16 the default since round 20);
"+iqni" (as Inductor's products and kernels, `run.iqn_target_kernel=inductor`); "+iqno" (the online IQN pass
and its gradient as three Triton kernels, `run.iqn_online_kernel=triton`); "+c51i" (the C51 target as Inductor's
kernels, `run.c51_target_kernel=inductor`); "+mlpt" (the target pass's networks, the online and target trunks and
C51 heads at s and s', as one Triton kernel, `run.target_mlp_kernel=triton`); "+subblocks" (each part of a combined
kernel with its own block sizes, Inductor's `combo_kernel_per_subkernel_blocks`: one `XBLOCK` shared by a
46,080-row reduction and a one-row one cost 0.309 ms in round 22). Each variant is compiled afresh (Dynamo's
in-memory cache and the plans' compiled wrappers are reset first), so one compiled under other Inductor settings is
never reused; `--fresh-cache` also keeps Inductor's on-disk caches out (`force_disable_caches`), so every kernel's
configuration is tuned in this process: round 22's `+iqno` step took 1.08 ms on a cache the tests had filled and
0.84 ms compiled afresh. Kernels are also counted by kind: matrix products (cuBLAS/CUTLASS), Inductor's Triton kernels,
others.
Each is built like `trainer bench` builds it, warmed up, timed over `--steps` steps with CUDA events,
then profiled over the same number of steps. `--trace DIR` also writes each variant's kernel timeline
(`DIR/PRESET-VARIANT.json`, `+` written `_`; Chrome's trace format: chrome://tracing or Perfetto),
where the streams' overlap and the chain that sets the step time can be read; totals cannot show them.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch._inductor import config as inductor_config
from torch.profiler import ProfilerActivity, profile

from trainer.algo.model import ModelDims
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.state import TrainState
from trainer.execution.plans.base import Plan
from trainer.execution.plans.fused import HORIZONTAL_OPTIONS, compile_replay_ops, compile_step
from trainer.runtime.timing import StepTimer
from trainer.tools.bench import (
    HORIZONTAL,
    BenchOptions,
    bench_spec,
    fill_with_random_transitions,
    method_plan,
    preset_config,
    run_steps,
)

KINDS = ("matmul", "triton", "other")
MATMUL_MARKS = ("gemm", "cutlass", "xmma", "splitKreduce", "cublas", "fmha", "flash", "nvjet")
"""Names of matrix-product kernels; `nvjet_*` are cuBLAS's own Hopper kernels (counted as "other" before
session 8, so rounds 3 and 4's "11 matmul" left out most of the products)."""


def kind(name: str) -> str:
    """A kernel's kind: a matrix product (attention's included), an Inductor/Triton kernel, or another."""
    if any(mark in name for mark in MATMUL_MARKS):
        return "matmul"
    return "triton" if name.startswith("triton") else "other"


def combo_kernel_cap(nodes: int) -> contextlib.AbstractContextManager[object]:
    """At most `nodes` kernels in one of Inductor's combined kernels inside the block (its default: 8).

    torch 2.13 has a setting for it; 2.11 hard-codes 8 in its grouping of the scheduler's independent
    nodes, which `_combo_grouping` replaces with the same grouping at another cap."""
    if hasattr(inductor_config, "combo_kernel_max_num_nodes"):
        return inductor_config.patch(combo_kernel_max_num_nodes=nodes)
    return _combo_grouping(nodes)


@contextlib.contextmanager
def _combo_grouping(nodes: int) -> Iterator[None]:
    """Inductor 2.11's grouping for combined kernels (each level of mutually independent scheduler
    nodes, in runs of at most `nodes`), with `nodes` for its hard-coded 8."""
    from torch._inductor.scheduler import ForeachKernelSchedulerNode

    def group(scheduler: Any) -> list[list[Any]]:
        levels = scheduler._topological_sort_nodes()  # [[node, ...], ...]: each level's nodes are independent
        return [level[i : i + nodes] for level in levels for i in range(0, len(level), nodes)]

    default = ForeachKernelSchedulerNode.group_algorithm_for_combo_kernels
    ForeachKernelSchedulerNode.set_group_algorithm_for_combo_kernels(group)
    try:
        yield
    finally:
        ForeachKernelSchedulerNode.set_group_algorithm_for_combo_kernels(default)


OVERRIDE_FLAGS = {
    "tree": "replay.search=tree",
    "c51k": "run.c51_target_kernel=triton",
    "c51i": "run.c51_target_kernel=inductor",
    "iqnk": "run.iqn_target_kernel=triton",
    "iqni": "run.iqn_target_kernel=inductor",
    "iqno": "run.iqn_online_kernel=triton",
    "mlpt": "run.target_mlp_kernel=triton",
}
"""Variant flags that are config overrides."""
SCOPE_FLAGS: dict[str, Callable[[], contextlib.AbstractContextManager[object]]] = {
    "combo16": lambda: combo_kernel_cap(16),
    "allcombo": lambda: mock.patch.dict(HORIZONTAL_OPTIONS, benchmark_combo_kernel=False),
    "nosplitred": lambda: inductor_config.patch(split_reductions=False),
    "autotune": lambda: inductor_config.patch(max_autotune_gemm=True),
    "tritongemm": lambda: inductor_config.patch(max_autotune_gemm=True, max_autotune_gemm_backends="TRITON"),
    "pdl": lambda: inductor_config.patch({"triton.enable_pdl": True}),
    "subblocks": lambda: inductor_config.patch(combo_kernel_per_subkernel_blocks=True),
}
"""Variant flags that are process settings, held while the variant is built (compiled, captured) and run."""


def split_variant(variant: str) -> tuple[str, list[str]]:
    """(bench method, flags): "zerocopy-bf16+combo+tree" -> ("zerocopy-bf16+combo", ["tree"])."""
    method, *flags = variant.split("+")
    if HORIZONTAL in flags:  # the bench's own suffix (`zerocopy-bf16+combo`): part of the method
        flags.remove(HORIZONTAL)
        method = f"{method}+{HORIZONTAL}"
    unknown = set(flags) - set(OVERRIDE_FLAGS) - set(SCOPE_FLAGS)
    if unknown:
        raise ValueError(
            f"unknown variant suffix {sorted(unknown)} (choose from {sorted([*OVERRIDE_FLAGS, *SCOPE_FLAGS])})"
        )
    return method, flags


def flags_scope(flags: list[str]) -> contextlib.ExitStack:
    """The process settings of a variant's flags, entered together."""
    stack = contextlib.ExitStack()
    for flag in flags:
        if flag in SCOPE_FLAGS:
            stack.enter_context(SCOPE_FLAGS[flag]())
    return stack


def build(
    method: str, flags: list[str], preset: str, options: BenchOptions, device: torch.device
) -> tuple[Plan, StepTimer]:
    overrides = [OVERRIDE_FLAGS[flag] for flag in flags if flag in OVERRIDE_FLAGS]
    config = preset_config(preset, BenchOptions(**{**vars(options), "overrides": overrides}))
    spec = bench_spec(config)
    replay = ReplayBuffer(config, spec, device, torch.Generator(device).manual_seed(1))
    fill_with_random_transitions(replay, options.capacity, 0)
    dims = ModelDims.build(config.model, spec.obs_dim, spec.branches, spec.actions)
    state = TrainState.create(config, dims, device)
    timer = StepTimer(device, enabled=False)
    plan_type, plan_config = method_plan(method, config)
    plan = plan_type(state, replay, plan_config, timer, torch.Generator(device).manual_seed(2))
    return plan, timer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", "--config", dest="preset", default="core", help="bench preset")
    parser.add_argument("--variant", action="append", default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--trace", type=Path, default=None, help="write each variant's timeline here")
    parser.add_argument("--fresh-cache", action="store_true", help="tune every kernel here, not from Inductor's caches")
    args = parser.parse_args()
    inductor_config.force_disable_caches = args.fresh_cache
    device = torch.device("cuda")
    options = BenchOptions(capacity=1_000_000, steps_per_replay=10)
    torch._dynamo.config.cache_size_limit = 256
    rows = []
    for variant in args.variant or ["fused", "zerocopy"]:
        began = time.perf_counter()
        try:
            method, flags = split_variant(variant)
            # compiled under this variant's settings, not served from an earlier one
            torch._dynamo.reset()
            compile_step.cache_clear()
            compile_replay_ops.cache_clear()
            with flags_scope(flags):
                plan, timer = build(method, flags, args.preset, options, device)
                step, _ = run_steps(plan, timer, 0, 20)
                torch.cuda.synchronize()
                setup = time.perf_counter() - began
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                step, _ = run_steps(plan, timer, step, args.steps)
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end) / args.steps
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    step, _ = run_steps(plan, timer, step, args.steps)
                    torch.cuda.synchronize()
        except Exception as error:  # report and go on to the next variant
            print(f"[{args.preset}] {variant}: failed: {type(error).__name__}: {str(error)[:400]}")
            continue
        if args.trace is not None:
            args.trace.mkdir(parents=True, exist_ok=True)
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", variant)  # `+` does not survive the device's file transfer
            prof.export_chrome_trace(str(args.trace / f"{args.preset}-{safe}.json"))
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.device_time for e in kernels) / 1e3 / args.steps  # ms per step
        by_name: collections.Counter[str] = collections.Counter()
        counts: collections.Counter[str] = collections.Counter()
        for e in kernels:
            by_name[e.name] += e.device_time
            counts[e.name] += 1
        kinds: collections.Counter[str] = collections.Counter(kind(e.name) for e in kernels)
        print(
            f"\n[{args.preset}] {variant}: {ms:.3f} ms/step, {len(kernels) / args.steps:.0f} kernels/step "
            f"({', '.join(f'{kinds[k] / args.steps:.0f} {k}' for k in KINDS)}), "
            f"kernel busy {busy:.3f} ms/step, setup {setup:.0f}s"
        )
        for name, total in by_name.most_common(args.top):
            print(f"  {total / 1e3 / args.steps:8.4f} ms  {counts[name] / args.steps:6.1f}x  {name[:110]}")
        rows.append((variant, ms, len(kernels) / args.steps, busy))
        del plan
        torch.cuda.empty_cache()
    print(f"\n{'variant':<28} {'ms/step':>8} {'kernels':>8} {'busy ms':>8}")
    for variant, ms, n, busy in rows:
        print(f"{variant:<28} {ms:8.3f} {n:8.0f} {busy:8.3f}")


if __name__ == "__main__":
    main()
