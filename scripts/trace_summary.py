"""What a `profile_step.py --trace` timeline says about the step's critical path, as text.

Per stream: kernel time per step; over all streams: the union of busy time (the GPU doing anything) and
the idle rest; and the longest stretches where a single stream runs alone (nothing beside it to
overlap: the chain that sets the step time), each with its first and last kernels. Streams are named
by id; inside a CUDA graph every step's side-stream work may get its own id.

    python scripts/trace_summary.py TRACE.json[.gz] [--steps 20] [--top 12]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path
from typing import Any

KINDS = ("kernel", "gpu_memset", "gpu_memcpy")


def load_kernels(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as file:
        events = json.load(file)["traceEvents"]
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in KINDS]
    return sorted(kernels, key=lambda e: e["ts"])


def union_busy(kernels: list[dict[str, Any]]) -> float:
    """µs during which at least one kernel runs (`kernels` sorted by start)."""
    busy, end = 0.0, float("-inf")
    for e in kernels:
        start, stop = e["ts"], e["ts"] + e["dur"]
        busy += max(0.0, stop - max(start, end))  # the part not already covered
        end = max(end, stop)
    return busy


def solo_stretches(kernels: list[dict[str, Any]], gap_us: float = 3.0) -> list[tuple[float, int, int, str, str]]:
    """Runs of consecutive kernels of one stream with no other stream's kernel between them:
    (µs, stream, kernels, first name, last name), longest first."""
    runs: list[list[Any]] = []
    for e in kernels:
        stream, start, end = e["args"].get("stream"), e["ts"], e["ts"] + e["dur"]
        last = runs[-1] if runs else None
        if last is not None and last[1] == stream and start - last[3] < gap_us:
            last[3], last[4], last[6] = max(last[3], end), last[4] + 1, e["name"]
        else:
            runs.append([start, stream, start, end, 1, e["name"], e["name"]])
    stretches = [(r[3] - r[2], r[1], r[4], r[5], r[6]) for r in runs]
    return sorted(stretches, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--steps", type=int, default=20, help="steps the profile covered (profile_step's --steps)")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    kernels = load_kernels(args.trace)
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    per_stream: collections.Counter[int] = collections.Counter()
    for e in kernels:
        per_stream[e["args"].get("stream")] += e["dur"]
    busy, total = union_busy(kernels), sum(per_stream.values())
    steps = args.steps
    print(f"{args.trace.name}: {len(kernels) / steps:.1f} kernels, {span / steps:.1f} µs per step")
    idle = span - busy
    print(f"  kernel time {total / steps:.1f} µs, busy (any stream) {busy / steps:.1f} µs, idle {idle / steps:.1f} µs")
    print(f"  overlap saves {(total - busy) / steps:.1f} µs per step")
    print("  per stream, µs per step: " + ", ".join(f"{s}: {t / steps:.1f}" for s, t in per_stream.most_common()))
    print(f"  longest single-stream stretches (of {steps} steps):")
    for us, stream, count, first, last in solo_stretches(kernels)[: args.top]:
        print(f"    {us:7.1f} µs  stream {stream:>4}  {count:3d} kernels  {first[:48]} .. {last[:48]}")


if __name__ == "__main__":
    main()
