"""Count the kernels Inductor generates for one training step, on the CPU (no GPU needed).

Usage: python scripts/kernel_count.py [--preset core] [-o key=value ...] [--batch-size 64] [--show]

`train_step` of a bench preset (the pinned model, a small replay and batch: the count
depends on the graph, not on B) is compiled with Inductor's default mode, as the fused plan compiles
it, and run once. Reported, per compiled graph and in total: the generated kernels (`cpp_fused_*` on
the CPU, `triton_*` on a GPU) and the calls of extern kernels (matrix products, sorts, fallback ops)
in the graphs' `call` functions. The CPU's fusion is not the GPU's, so the counts are a proxy for
the profiler's kernels per step: use them to compare two versions of the step, before spending
device time.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

import torch
from torch._inductor.utils import run_and_get_code

from trainer.bench import BenchOptions, bench_spec, fill_with_random_transitions, preset_config
from trainer.model import ModelDims
from trainer.plans._capture import precision_scope
from trainer.replay.buffer import ReplayBuffer
from trainer.state import TrainState
from trainer.step import Draws, Hyper, StepFlags, train_step

GENERATED = re.compile(r"^\s+(?:\w+ = )?(cpp_fused_\w+|triton_\w+)(?:\.run)?\(", re.M)
EXTERN = re.compile(r"(extern_kernels\.\w+|torch\.ops\.\w+\.\w+(?:\.\w+)?|aten\.\w+(?:\.\w+)?)\(")


def call_body(source: str) -> str:
    """The text of the compiled module's `call` function (where the kernels are launched)."""
    start = source.find("def call(")
    if start < 0:
        return ""
    end = source.find("\ndef ", start + 1)
    return source[start : end if end > 0 else len(source)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", "--config", dest="preset", default="core", help="bench preset")
    parser.add_argument("-o", "--override", action="append", default=[])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--show", action="store_true", help="list the extern calls by name")
    parser.add_argument("--code", type=Path, default=None, help="write each graph's generated code here")
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
    compiled = torch.compile(train_step, dynamic=False)
    with precision_scope(config.run.precision, default_tf32=False):
        _, sources = run_and_get_code(compiled, state, batch, draws, hp, StepFlags())
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
        f"[{args.preset}] {' '.join(args.override)}: {len(sources)} graphs, {generated} generated kernels, "
        f"{extern} extern calls, {generated + extern} in all"
    )
    if args.show:
        for name, count in names.most_common():
            print(f"  {count:4d}  {name}")


if __name__ == "__main__":
    main()
