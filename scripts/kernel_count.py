"""Count the kernels Inductor generates for one training step, on the CPU (no GPU needed).

Usage: python scripts/kernel_count.py [--preset core] [-o key=value ...] [--batch-size 64] [--show] [--as-plan]

`train_step` of a bench preset (the pinned model, a small replay and batch: the count
depends on the graph, not on B) is compiled with Inductor's default mode, as the fused plan compiles
it, and run once. Reported, per compiled graph and in total: the generated kernels (`cpp_fused_*` on
the CPU, `triton_*` on a GPU) and the calls of extern kernels (matrix products, sorts, fallback ops)
in the graphs' `call` functions. The CPU's fusion is not the GPU's, so the counts are a proxy for
the profiler's kernels per step: use them to compare two versions of the step, before spending
device time.

`--as-plan` compiles the step as the fused plan does: the stream router's sections (attention, IQL, the
guard's join) as calls Dynamo breaks around (`trainer.execution.plans.fused._EagerSections`, over a router
with no streams), so the step is several graphs; it also counts the ATen ops the step runs outside
every compiled graph (each an eager kernel on a GPU), from the profiler.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import torch
from torch._inductor.utils import run_and_get_code
from torch.profiler import ProfilerActivity, profile

from trainer.algo.model import ModelDims
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.state import TrainState
from trainer.algo.step import NO_TIMER, Draws, Hyper, SectionTimer, StepFlags, train_step
from trainer.execution.plans._capture import StreamRouter, precision_scope
from trainer.execution.plans.fused import _EagerSections, compile_step
from trainer.tools.bench import BenchOptions, bench_spec, fill_with_random_transitions, preset_config

GENERATED = re.compile(r"^\s+(?:\w+ = )?(cpp_fused_\w+|triton_\w+)(?:\.run)?\(", re.M)
EXTERN = re.compile(r"(extern_kernels\.\w+|torch\.ops\.\w+\.\w+(?:\.\w+)?|aten\.\w+(?:\.\w+)?)\(")


def call_body(source: str) -> str:
    """The text of the compiled module's `call` function (where the kernels are launched)."""
    start = source.find("def call(")
    if start < 0:
        return ""
    end = source.find("\ndef ", start + 1)
    return source[start : end if end > 0 else len(source)]


class NoStreams:
    """The router's sections by name (what `_EagerSections` breaks Dynamo's graph at), without CUDA streams."""

    FORKS: ClassVar[dict[str, str]] = StreamRouter.FORKS
    JOINS: ClassVar[frozenset[str]] = StreamRouter.JOINS

    def section(self, name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def eager_ops(run: Callable[[], object]) -> tuple[collections.Counter[str], int]:
    """The ATen ops one call of `run` makes outside every compiled graph, and how many compiled graphs
    it called (profiled on the CPU)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    outside: collections.Counter[str] = collections.Counter()
    graphs = 0
    for event in prof.events():
        graphs += event.name.startswith("## Call CompiledFxGraph")
        parent = event.cpu_parent
        if not event.name.startswith("aten::") or parent is None or parent.name.startswith("aten::"):
            continue
        if parent.name.startswith("Torch-Compiled Region"):  # called by the compiled frame's Python, not a graph
            outside[event.name] += 1
    return outside, graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", "--config", dest="preset", default="core", help="bench preset")
    parser.add_argument("-o", "--override", action="append", default=[])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--show", action="store_true", help="list the extern calls by name")
    parser.add_argument("--code", type=Path, default=None, help="write each graph's generated code here")
    parser.add_argument("--as-plan", action="store_true", help="with the router's sections as graph breaks")
    args = parser.parse_args()
    options = BenchOptions(capacity=4096, batch_size=args.batch_size, overrides=args.override)
    config = preset_config(args.preset, options)
    device = torch.device("cpu")
    replay = ReplayBuffer(config, bench_spec(config), device, torch.Generator().manual_seed(1))
    fill_with_random_transitions(replay, options.capacity, 0)
    dims = ModelDims.build(config.model, replay.spec.obs_dim, replay.spec.branches, replay.spec.actions)
    state = TrainState.create(config, dims, device)
    batch = replay.sample(config.run.batch_size, 0)
    draws = Draws.empty(dims, config.run.batch_size, device, permute=config.loss.causal)
    draws.fill_(torch.Generator().manual_seed(2))
    hp = Hyper.from_config(config)
    compiled = compile_step() if args.as_plan else torch.compile(train_step, dynamic=False)
    timer: SectionTimer = _EagerSections(NoStreams()) if args.as_plan else NO_TIMER  # type: ignore[arg-type]
    with precision_scope(config.run.precision, default_tf32=False):
        _, sources = run_and_get_code(compiled, state, batch, draws, hp, StepFlags(), timer)
        outside, _ = eager_ops(lambda: compiled(state, batch, draws, hp, StepFlags(), timer))
    generated = extern = 0
    names: collections.Counter[str] = collections.Counter()
    for i, source in enumerate(sources):
        if args.code is not None:
            args.code.mkdir(parents=True, exist_ok=True)
            (args.code / f"graph{i}.py").write_text(source)
        body = call_body(source)
        g = len(GENERATED.findall(body))
        calls = EXTERN.findall(body)
        names.update(calls)
        generated += g
        extern += len(calls)
        print(f"graph {i}: {g} generated kernels, {len(calls)} extern calls")
    print(
        f"[{args.preset}] {' '.join(args.override)}{' as the plan' if args.as_plan else ''}: {len(sources)} graphs, "
        f"{generated} generated kernels, {extern} extern calls, {generated + extern} in all; "
        f"{sum(outside.values())} ATen ops outside the graphs"
    )
    if args.show:
        for name, count in names.most_common():
            print(f"  {count:4d}  {name}")
        for name, count in outside.most_common():
            print(f"  {count:4d}  {name} (outside the graphs)")


if __name__ == "__main__":
    main()
