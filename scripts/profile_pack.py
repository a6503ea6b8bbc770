"""Where a pack's step time goes, and when a pack first parts from its solo runs (issue 31).

Usage: python scripts/profile_pack.py [--sizes 1,16] [--precision fp32] [--capacity 100000] [--top 20] [--compiled]
       [--config RECIPE.yaml] [-o KEY=VALUE ...] [--no-divergence | --divergence-only [--updates 100]] [--keyed-ops]
       [--device cpu]

1. Kernels of one eager (`--compiled`: Inductor's) pack step (`trainer.execution.pack.PackPlan`, not captured,
   so each kernel is seen) on `core` (`--config`: a recipe's model, batch and replay, over random transitions of
   its shapes, e.g. the market's, whose packed update is where its pack falls short of 8×) at each size K: the
   count, the CUDA time per step, the peak memory, and the costliest kernels by name, K against K = 1: which
   kernels grow with K and by how much. With `--device cpu`, each Inductor kernel's and ATen op's CPU time instead
   (Inductor's kernel profile on): on a machine without a GPU, what grows faster than K moves more memory per run
   than it should.
2. When run i of a captured pack (K = 4, float32, `core` with the `-o` overrides, e.g. run.rng=keyed) first
   differs from its solo graph plan and from its solo run stepped eagerly: the relative errors of `state.online`
   and of the replay's priorities after each graph replay (10 updates) for the first `--updates`, and each run's
   keyed counters; on a GPU the same pack stepped eagerly too (capture, or packing?), and with `--keyed-ops` the
   keyed draws as torch ops instead of the Triton kernel. On the CPU the same with the eager pack and eager solo
   plans. `--divergence-only` skips part 1.
"""

from __future__ import annotations

import argparse
import collections
import functools
import re
from collections.abc import Callable, Sequence

import torch
from torch._inductor import config as inductor_config
from torch.profiler import ProfilerActivity, profile

from contracts.config import TrainConfig, load_config
from trainer.algo import rng
from trainer.algo.rng import KeyedGenerator
from trainer.execution.pack import Pack, PackPlan
from trainer.execution.plans.base import BasePlan
from trainer.tools.bench import (
    BenchOptions,
    method_config,
    preset_config,
    random_run,
    relative_error,
    solo_runs,
    solo_runs_beside_pack,
)


def runs(base: TrainConfig, size: int, capacity: int, device: torch.device) -> tuple[list[TrainConfig], Callable]:
    configs = [
        base.model_copy(
            update={
                "run": base.run.model_copy(update={"seed": i, "device": device.type}),
                "optim": base.optim.model_copy(update={"lr": base.optim.lr * (1 + i % 4)}),
            }
        )
        for i in range(size)
    ]

    return configs, functools.partial(random_run, transitions=capacity)


def kernels(
    size: int, base: TrainConfig, capacity: int, device: torch.device, compiled: bool = False
) -> dict[str, tuple[int, float]]:
    """name -> (launches, ms) per pack step, over 3 profiled steps after 3 warm-up steps: each CUDA kernel's device
    time, or on the CPU each Inductor kernel's and ATen op's own time (`cpu_kernels`)."""
    configs, make = runs(base, size, capacity, device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    plan = PackPlan(Pack(configs, make), compiled=compiled)
    for step in range(3):
        plan.run(step)
    if not cuda:
        return cpu_kernels(plan)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for step in range(3, 6):
            plan.run(step)
        torch.cuda.synchronize()
    print(f"K={size}: peak {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB (replays included)")
    table: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            row = table[event.name[:90]]
            row[0] += 1 / 3
            row[1] += event.device_time_total / 1e3 / 3
    return {name: (round(n), ms) for name, (n, ms) in table.items()}


def cpu_kernels(plan: PackPlan) -> dict[str, tuple[int, float]]:
    """The CPU's form of `kernels`: self time per Inductor kernel (`cpp.enable_kernel_profile`, set before the pack
    compiles) and per ATen op, which on the CPU is where a step's time goes. What grows faster than K here moves
    more memory per run than it should (packs round 9: the sum-tree's levels)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(3, 6):
            plan.run(step)
    own = [e for e in prof.key_averages() if e.key.startswith(("graph_", "aten::")) and e.self_cpu_time_total > 0]
    # "graph_1_cpp_fused_..." -> "cpp_fused_...": each K compiles a graph of its own, whose kernels match by name
    return {re.sub(r"^graph_\d+_", "", e.key)[:90]: (round(e.count / 3), e.self_cpu_time_total / 1e3 / 3) for e in own}


def counters(generator: torch.Generator) -> int | None:
    """A keyed generator's counter (its draws so far); None for torch's own."""
    return int(generator.counter.item()) if isinstance(generator, KeyedGenerator) else None


def divergence(base: TrainConfig, capacity: int, device: torch.device, updates: int = 100) -> list[dict[str, object]]:
    """Run i of a captured pack (K = 4; eager on the CPU) beside its solo plan and its solo run stepped eagerly, both
    built afresh, and on a GPU beside the same pack stepped eagerly too: after each of the pack's calls,
    `state.online`'s and the priorities' relative error for each pair, each run's generator counters (replay, draws)
    under `run.rng: keyed`, and whether the last update sampled the same slots and step uniforms in each form: which
    form leaves the eager numbers (capture, or packing itself), and from which draw (packs round 14: a keyed packed
    graph parted from its solo graphs)."""
    plan = "graph" if device.type == "cuda" else "eager"
    configs, make = runs(base, 4, capacity, device)
    solos, packed = solo_runs_beside_pack(configs, make, plan)
    eagers = solo_runs(configs, make, "eager")
    eager_pack = PackPlan.for_plan(Pack(configs, make), "eager") if plan == "graph" else packed
    pack = packed.pack
    print(f"pack ({packed.name}) against solo {plan} plans, eager solo runs and the eager pack, run.rng={base.run.rng}")
    print("updates run  online: pack-solo pack-eager solo-eager epack-eager  priorities: pack-solo pack-eager", end="")
    print("  counters (replay, draws) pack/solo/eager")
    rows: list[dict[str, object]] = []
    for step in range(0, updates, packed.steps_per_call):
        packed.run(step)
        for _, solo_plan in solos:
            solo_plan.run(step)
        for update in range(step, step + packed.steps_per_call):
            for _, eager_plan in eagers:
                eager_plan.run(update)
            if eager_pack is not packed:
                eager_pack.run(update)
        for i, ((solo, solo_plan), (eager, eager_plan)) in enumerate(zip(solos, eagers, strict=True)):
            online, tree = pack.states[i].online, pack.replays[i].sampler.tree
            forms = [
                (pack.replays[i], pack.generators[i]),
                (solo.replay, solo.generator),
                (eager.replay, eager.generator),
            ]
            errors = [
                relative_error(online, solo.state.online),
                relative_error(online, eager.state.online),
                relative_error(solo.state.online, eager.state.online),
                relative_error(eager_pack.pack.states[i].online, eager.state.online),
            ]
            priorities = [
                relative_error(tree, solo.replay.sampler.tree),
                relative_error(tree, eager.replay.sampler.tree),
            ]
            drawn = [(counters(replay.generator), counters(draws)) for replay, draws in forms]
            # the last update's sampled slots and step uniforms, left in each form's static buffers: which draw differs
            slots, uniforms = packed.batch["index"][i], packed.uniform[i]
            assert isinstance(solo_plan, BasePlan) and isinstance(eager_plan, BasePlan)  # static batch and draws
            same = {
                "slots": [torch.equal(slots, plan.batch.index) for plan in (solo_plan, eager_plan)],
                "uniforms": [torch.equal(uniforms, plan.draws.uniform) for plan in (solo_plan, eager_plan)],
            }
            updated = step + packed.steps_per_call
            rows.append(
                {"updates": updated, "run": i, "online": errors, "priorities": priorities, "counters": drawn} | same
            )
            listed = " ".join(f"{e:.2e}" for e in errors), " ".join(f"{e:.2e}" for e in priorities)
            print(f"{updated:>7} {i:>3}  {listed[0]}  {listed[1]}  {drawn}  same slots, uniforms: {same}")
    return rows


def base_config(recipe: str | None, precision: str | None, capacity: int, overrides: Sequence[str] = ()) -> TrainConfig:
    """What every run of the profiled packs starts from: `core` (fp32 unless `precision`), or the recipe at `recipe`
    in its own precision unless `precision`; the replay holds `capacity` transitions; `overrides` (KEY=VALUE, e.g.
    run.combo_kernels=true) over either."""
    if recipe is None:
        core = preset_config("core", BenchOptions(capacity=capacity, overrides=list(overrides)))
        return method_config(core, f"graph-{precision or 'fp32'}")
    config = load_config(recipe, [f"replay.capacity={capacity}", *overrides])
    return method_config(config, f"graph-{precision}") if precision else config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,16")
    parser.add_argument("--precision", help="fp32 or bf16 (default: fp32 on `core`, a recipe's own with --config)")
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--compiled", action="store_true", help="the pack through Inductor (PackPlan(compiled=True))")
    parser.add_argument("--config", help="a recipe's model, batch size and replay instead of `core`'s")
    parser.add_argument(
        "-o", "--override", action="append", default=[], help="KEY=VALUE over the config (e.g. run.combo_kernels=true)"
    )
    parts = parser.add_mutually_exclusive_group()
    parts.add_argument("--no-divergence", action="store_true", help="kernels only")
    parts.add_argument("--divergence-only", action="store_true", help="the pack against its solo runs only")
    parser.add_argument("--updates", type=int, default=100, help="updates the divergence part steps")
    parser.add_argument(
        "--keyed-ops", action="store_true", help="keyed draws as torch ops on a GPU too (not the Triton kernel)"
    )
    parser.add_argument("--device", default="cuda", help="cuda, or cpu (Inductor's and ATen's CPU time)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.keyed_ops:  # every keyed draw through `rng.keyed_draw_` (KeyedRows' and KeyedGenerator's): its torch form
        rng.keyed_draw_ = rng.keyed_draw_ops_
    if not args.no_divergence:
        core = preset_config("core", BenchOptions(batch_size=256, capacity=20_000, overrides=list(args.override)))
    if args.divergence_only:
        divergence(core, 20_000, device, args.updates)
        return
    if device.type == "cpu":
        inductor_config.cpp.enable_kernel_profile = True  # each generated kernel a profiler event of its own
        print(f"CPU: {torch.get_num_threads()} threads")
    base = base_config(args.config, args.precision, args.capacity, args.override)
    args.precision = base.run.precision
    sizes = [int(k) for k in args.sizes.split(",")]
    tables = {k: kernels(k, base, args.capacity, device, args.compiled) for k in sizes}
    kind = "compiled" if args.compiled else "eager"
    first = tables[sizes[0]]
    for k, table in tables.items():
        total = sum(ms for _, ms in table.values())
        print(
            f"\nK={k} ({args.precision}, {kind} pack): {sum(n for n, _ in table.values())} kernels, {total:.3f} ms "
            f"of {'kernel' if device.type == 'cuda' else 'CPU'} time per pack step"
        )
    last = tables[sizes[-1]]
    print(f"\ncostliest kernels at K={sizes[-1]} (launches, ms per pack step; at K={sizes[0]}):")
    for name, (n, ms) in sorted(last.items(), key=lambda item: -item[1][1])[: args.top]:
        n0, ms0 = first.get(name, (0, 0.0))
        print(f"  {ms:8.3f} ms {n:4d}x  (K={sizes[0]}: {ms0:7.3f} ms {n0:4d}x)  {name}")
    if not args.no_divergence:
        print()
        divergence(core, 20_000, device, args.updates)


if __name__ == "__main__":
    main()
