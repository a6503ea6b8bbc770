"""Split-K by hand for a compiled pack's batched products over long rows (issue 31).

A pack's weight gradients over many rows a run (attention's projections over B·W = 2,048 rows, IQN's hidden layer
over B·T = 1,024 at the market's size) reach Inductor as one batched product per layer, `bmm(dyᵀ, x)` over the runs.
cuBLAS splits the rows of one run's product into parallel slices (split-K) but not those of a batched one: each run's
small [out, in] result is a few tiles, each looping over every row (round 11's profile of the market pack: 0.42 ms of
its update's 1.48 ms of kernel time in such products, some as plain FFMA kernels). `SplitLongRows`, an Inductor
post-grad pass, rewrites each such product as the runs × chunks products of the rows' chunks and a sum over the
chunks: more tiles, each over fewer rows, one small reduction after. The pack's plan applies it under
`run.pack_split_k` (`trainer.execution.pack.PackPlan`); `scripts/bench_small_ops.py --ops packgrads` times the two
forms alone.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx import Graph, Node

aten = torch.ops.aten

MIN_ROWS = 1024
"""The fewest rows a run for a product to be split: the market's attention (2,048) and IQN (1,024) gradients."""
CHUNK_ROWS = 256
"""Rows a chunk: 8 chunks of attention's 2,048 rows, 4 of IQN's 1,024."""
MAX_OUTPUTS = 128 * 128
"""The largest result a run [out, in] worth splitting: a larger one has tiles enough without it."""


class SplitLongRows(CustomGraphPass):
    """`bmm(a, b)` with a [R, M, K] and b [R, K, N], K ≥ `min_rows` a multiple of `chunk_rows` and M·N ≤
    `max_outputs`, as `bmm(a', b').view(R, C, M, N).sum(1)` with a' [R·C, M, K/C] and b' [R·C, K/C, N] views of the
    C = K / chunk_rows chunks of rows (no copy: a product whose operands cannot be viewed so is left as it is).
    `rewritten` lists each rewritten product's (R, M, K, N), of the compilations that ran the pass (one answered by
    Inductor's cache, which keys it by `uuid`, runs none)."""

    def __init__(self, min_rows: int = MIN_ROWS, chunk_rows: int = CHUNK_ROWS, max_outputs: int = MAX_OUTPUTS) -> None:
        self.min_rows, self.chunk_rows, self.max_outputs = min_rows, chunk_rows, max_outputs
        self.rewritten: list[tuple[int, int, int, int]] = []

    def uuid(self) -> str:
        """Inductor's cache key of the pass: its code and its thresholds."""
        with open(__file__, "rb") as source:
            code = source.read()
        settings = f"{self.min_rows},{self.chunk_rows},{self.max_outputs}".encode()
        return hashlib.sha256(code + settings).hexdigest()

    def __call__(self, graph: Graph) -> None:
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target is aten.bmm.default and self.wanted(node):
                self.split(graph, node)

    def wanted(self, node: Node) -> bool:
        _, outputs, rows, inputs = _sizes(node)
        return rows >= self.min_rows and rows % self.chunk_rows == 0 and outputs * inputs <= self.max_outputs

    def split(self, graph: Graph, node: Node) -> None:
        a, b = node.args
        runs, outputs, rows, inputs = _sizes(node)
        chunks, per_chunk = rows // self.chunk_rows, self.chunk_rows
        added: list[Node] = []

        def call(target: Any, *args: Any) -> Node:
            """A node of `target`, its fake value computed from its inputs' (what Inductor's lowering reads)."""
            values = [arg.meta["val"] if isinstance(arg, Node) else arg for arg in args]
            with values[0].fake_mode:
                value = target(*values)  # raises where a view is impossible
            new = graph.call_function(target, tuple(args))
            new.meta["val"] = value
            added.append(new)
            return new

        with graph.inserting_before(node):
            try:
                a_chunks = call(aten.view.default, a, [runs, outputs, chunks, per_chunk])  # [R, M, C, K/C]
                a_chunks = call(aten.permute.default, a_chunks, [0, 2, 1, 3])  # [R, C, M, K/C]
                a_chunks = call(aten.view.default, a_chunks, [runs * chunks, outputs, per_chunk])
                b_chunks = call(aten.view.default, b, [runs * chunks, per_chunk, inputs])  # [R·C, K/C, N]
            except (RuntimeError, ValueError):  # an operand whose rows cannot be cut into views
                for new in reversed(added):
                    graph.erase_node(new)
                return
            partial = call(aten.bmm.default, a_chunks, b_chunks)  # [R·C, M, N]
            partial = call(aten.view.default, partial, [runs, chunks, outputs, inputs])
            total = call(aten.sum.dim_IntList, partial, [1])  # [R, M, N]
        node.replace_all_uses_with(total)
        graph.erase_node(node)
        self.rewritten.append((runs, outputs, rows, inputs))


def _sizes(product: Node) -> tuple[int, int, int, int]:
    """(R, M, K, N) of `bmm(a [R, M, K], b [R, K, N])`."""
    a, b = product.args
    runs, outputs, rows = a.meta["val"].shape  # type: ignore[union-attr]
    return runs, outputs, rows, b.meta["val"].shape[2]  # type: ignore[union-attr]
