"""Proportional prioritised sampling (Schaul et al. 2016) from a sum-tree kept on the device.

    P(i) = p_i^alpha / sum_j p_j^alpha             (alpha = 0 is uniform sampling)
    w_i  = (N * P(i))^-beta / max_{b in batch} w_b (N = transitions stored, beta annealed to 1)
    p_i  = |loss_i| + eps                          (new transitions get the largest p seen so far)

The tree is one float64 array of 2*P entries (P = capacity rounded up to a power of two): node 1 is
the root, node n has children 2n and 2n+1, leaves P..2P-1 hold p_i^alpha. Sampling and updates are
tensor ops over the batch with a fixed Python loop over the log2(P) levels: no host sync, so both can
be captured in a CUDA graph. float64 keeps the sums exact enough at a million leaves.

`search="cdf"` draws the same slots by a cumulative sum over the leaves (in two levels: blocks of √P
leaves and the blocks' sums) and binary searches instead of the level-by-level descent: on an H200
(capacity 1M, B = 1024, in a CUDA graph) about 0.03 ms against 0.31 ms with one scan, as the descent is
launch-bound (log2(P) = 20 levels of small kernels). Since the scan also yields the total, this mode
keeps only the leaves current: a priority write-back is one indexed write instead of one and 20 level
sums. The inner nodes are rebuilt when a checkpoint is
loaded into a sampler that descends.
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch
from torch import Tensor

from trainer.algo.rng import uniform_


class Sampler(Protocol):
    """Picks slots to train on and learns their priorities."""

    def on_write(self, slots: Tensor, size: int) -> None: ...

    def sample(self, batch_size: int, step: int | Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]: ...

    def update(self, index: Tensor, loss: Tensor) -> None: ...

    def state_dict(self) -> dict[str, Tensor]: ...

    def load_state_dict(self, state: dict[str, Tensor]) -> None: ...


def _check_unit(name: str, value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return float(value)


class PrioritizedSampler:
    """Sum-tree PER sampler with alpha fixed and beta annealed linearly over `total_steps` updates."""

    def __init__(
        self,
        capacity: int,
        device: torch.device | str,
        *,
        alpha: float,
        beta_start: float,
        beta_end: float,
        total_steps: int,
        eps: float = 1e-6,
        search: Literal["tree", "cdf"] = "tree",
    ) -> None:
        if search not in ("tree", "cdf"):
            raise ValueError(f"sampler search must be 'tree' or 'cdf', got {search!r}")
        self.search = search
        if capacity < 1:
            raise ValueError(f"sampler capacity must be >= 1, got {capacity}")
        if total_steps < 1:
            raise ValueError(f"total_steps for the beta schedule must be >= 1, got {total_steps}")
        if eps <= 0.0:
            raise ValueError(f"priority eps must be > 0, got {eps}")
        self.alpha = _check_unit("replay.alpha", alpha)
        self.beta_start = _check_unit("replay.beta_start", beta_start)
        self.beta_end = _check_unit("replay.beta_end", beta_end)
        self.total_steps = total_steps
        self.eps = eps
        self.capacity = capacity
        self.depth = max(1, (capacity - 1).bit_length())  # log2(P)
        self.leaves = 1 << self.depth  # P
        self.device = torch.device(device)
        self.tree = torch.zeros(2 * self.leaves, dtype=torch.float64, device=self.device)
        self.max_priority = torch.ones((), dtype=torch.float64, device=self.device)
        self.size = torch.zeros((), dtype=torch.int64, device=self.device)

    def beta(self, step: int | Tensor) -> float | Tensor:
        """beta(step) = beta_start + (beta_end - beta_start) * min(step / total_steps, 1)."""
        frac: float | Tensor
        if isinstance(step, Tensor):
            frac = (step.to(torch.float64) / self.total_steps).clamp(0.0, 1.0)
        else:
            frac = min(max(step / self.total_steps, 0.0), 1.0)
        return self.beta_start + (self.beta_end - self.beta_start) * frac

    def total(self) -> Tensor:
        """sum_j p_j^alpha: the root, or the leaves' sum where only they are kept (search="cdf")."""
        return self.tree[1] if self.search == "tree" else self.priorities().sum()

    def priorities(self) -> Tensor:
        """p_i^alpha of every slot [capacity] (a view of the leaves)."""
        return self.tree[self.leaves : self.leaves + self.capacity]

    def _set_leaves(self, slots: Tensor, value: Tensor, repeats: bool = False, power: float | Tensor = 1.0) -> None:
        """Write leaves value^power, then their parents where the descent reads them.

        `repeats`: `slots` may repeat with different values, and a repeated slot gets the largest, whatever
        order the writes run in, so two runs of one seed (eager and a graph plan) keep equal trees. Without
        it the write is a plain indexed one, which keeps whichever duplicate a GPU happened to write last.
        """
        leaves = (slots + self.leaves).to(torch.int64)  # [M]
        value = value.to(self.tree.dtype).expand(leaves.shape)  # [M]
        if not repeats:
            self.tree[leaves] = raised(value, power)
        elif torch.compiler.is_compiling():
            # Inductor leaves scatter_reduce to ATen's kernels (they fill, reduce and copy the whole tree:
            # ~28 µs of an H200 step); the pairwise max is one fused kernel before one indexed write. The power
            # after the max: x ↦ x^power keeps the values' order (x > 0, power ≥ 0), so the largest's power is
            # the largest power, and the kernel raises M values, not M² pairs (Inductor computes a pointwise
            # input inside the pairwise loop: a float64 pow a pair was most of the kernel's 16 µs on an H100).
            self.tree[leaves] = raised(max_of_duplicates(slots, value), power)
        else:  # eager, where the pairwise max's M² pairs cost ~1 ms of a CPU core at M = 1024, ATen's ~6 µs
            self.tree.scatter_reduce_(0, leaves, raised(value, power), "amax", include_self=False)
        if self.search == "tree":
            self._sum_levels(leaves)

    def _sum_levels(self, written: Tensor | None = None) -> None:
        """Recompute every parent level from its children, leaves up. (`written`, the tree positions just written,
        is for a pack, which sums only their paths: `trainer.execution.pack.sum_written_paths`.)

        Level d holds nodes [2^d, 2^(d+1)); its children are the next level read as pairs. Summing
        whole levels is one kernel per level: fewer launches than walking the changed paths. Each node is
        left + right, one add of the pair's columns: a sum over the pairs' dimension gives the same values,
        but on the CPU its reduction over rows of two took ~6x as long (2.4 ms against 0.4 ms a write at
        capacity 50k, every replay add and priority write-back).
        """
        for depth in range(self.depth - 1, -1, -1):
            children = self.tree[2 << depth : 4 << depth].view(-1, 2)  # [2^d, 2]
            torch.add(children[:, 0], children[:, 1], out=self.tree[1 << depth : 2 << depth])

    def on_write(self, slots: Tensor, size: int) -> None:
        """New rows at `slots` get p = max priority so far; `size` rows are now stored."""
        value = self.max_priority.pow(self.alpha).expand(slots.shape[0])  # [M]
        self._set_leaves(slots.to(self.device), value)
        self.size.fill_(min(size, self.capacity))

    def update(self, index: Tensor, loss: Tensor) -> None:
        """p = |loss| + eps for the sampled slots `index` [B]; tree and max priority follow."""
        p = loss.detach().abs().to(torch.float64) + self.eps  # [B]
        p = torch.where(torch.isfinite(p), p, self.max_priority)  # a non-finite loss must not poison the tree
        self._set_leaves(index, p, repeats=True, power=self.alpha)
        # An indexed write: under torch.compile (2.13, CPU) an out= or copy_ into this 0-d input is dropped
        # (tests/trainer/execution/plans/test_replay_ops.py caught it); the indexed write is kept.
        self.max_priority[...] = torch.maximum(self.max_priority, p.max())

    def sample(self, batch_size: int, step: int | Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Stratified draw of `batch_size` slots and their importance weights ([B] int64, [B] float32)."""
        return self.locate(self.draw(batch_size, generator), step)

    def draw(self, batch_size: int, generator: torch.Generator) -> Tensor:
        """The random half of `sample`: one point per stratum, U(0, 1) [B] float64.

        Apart from `locate` (no random numbers), so a compiled plan can compile `locate` and draw here:
        Dynamo does not trace an explicit generator.
        """
        return uniform_(torch.empty(batch_size, device=self.device, dtype=torch.float64), generator)

    def locate(self, draw: Tensor, step: int | Tensor) -> tuple[Tensor, Tensor]:
        """The slots and importance weights of the points `draw` [B] ([B] int64, [B] float32).

        Segment b of the total mass [b, b+1) * total / B gets the point u_b = b + draw_b, mapped to the
        slot i whose mass interval [sum_{j<i} p_j^alpha, sum_{j<=i} p_j^alpha) holds it.
        """
        batch_size = draw.shape[0]
        strata = torch.arange(batch_size, device=self.device, dtype=torch.float64) + draw  # [B] b + U(0, 1)
        if self.search == "tree":
            total = self.tree[1]
            index = self._descend(strata * (total / batch_size))  # [B]
        else:
            inner, block_cdf = self._cdf_blocks()
            total = block_cdf[-1]
            index = self._invert_cdf(inner, block_cdf, strata * (total / batch_size))  # [B]
        # w_i = (N * P(i))^-beta, normalised by the batch maximum
        prob = self.tree[index + self.leaves] / total  # [B]
        # beta from a device step whether `step` is an int (eager) or a tensor (in a graph), so both
        # round alike: the device divides by a scalar through its reciprocal, and pow by a host scalar
        # takes special-cased kernels (-0.5, -1).
        if not isinstance(step, Tensor):
            step = torch.full((), step, dtype=torch.int64, device=self.device)
        weight = (self.size.to(torch.float64) * prob).pow(-self.beta(step))  # [B]
        return index, (weight / weight.max()).to(torch.float32)

    def _descend(self, u: Tensor) -> Tensor:
        """search="tree": each level sends u right (minus the left mass) when u >= left and right has mass."""
        node = torch.ones(u.shape[0], dtype=torch.int64, device=self.device)  # [B]
        pairs = self.tree.view(-1, 2)  # row n holds the children (2n, 2n+1) of node n
        for _ in range(self.depth):
            pair = pairs[node]  # [B, 2]
            go_right = (u >= pair[:, 0]) & (pair[:, 1] > 0)  # [B]
            u = torch.where(go_right, u - pair[:, 0], u)
            node = 2 * node + go_right
        return node - self.leaves

    def _cdf_blocks(self) -> tuple[Tensor, Tensor]:
        """search="cdf": the leaves' scan in two levels, the P leaves as √P blocks of √P (1024 × 1024 at a
        million): each block's own scan [nb, bs], then the scan of the blocks' sums [nb]. Each is a kernel of
        independent short rows, where one scan of a million leaves takes Inductor's split scan (a zeroed
        workspace, then 28 µs of an H200 step)."""
        block = 1 << ((self.depth + 1) // 2)  # bs
        inner = self.tree[self.leaves :].view(-1, block).cumsum(1)  # [nb, bs] mass up to each leaf of its block
        return inner, inner[:, -1].cumsum(0)  # [nb, bs], [nb] mass up to each block's end

    def _invert_cdf(self, inner: Tensor, block_cdf: Tensor, u: Tensor) -> Tensor:
        """search="cdf": the block whose mass interval holds u, then the leaf within it, by two binary searches.

        Same slots as the descent up to float rounding; empty slots (zero mass) are never found, and a u
        rounded up past its block's or the last slot's mass is clamped to that block's last leaf or the
        last stored slot.
        """
        blocks, block = inner.shape
        index = torch.searchsorted(block_cdf, u, right=True).clamp(max=blocks - 1)  # [B] the block
        before = torch.where(index > 0, block_cdf[(index - 1).clamp(min=0)], 0.0)  # [B] mass of the blocks before
        leaf = torch.searchsorted(inner[index], (u - before)[:, None], right=True).squeeze(1)  # [B]
        return torch.minimum(index * block + leaf.clamp(max=block - 1), self.size - 1)

    def state_dict(self) -> dict[str, Tensor]:
        return {"tree": self.tree, "max_priority": self.max_priority, "size": self.size}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if state["tree"].shape != self.tree.shape:
            raise ValueError(
                f"replay sampler checkpoint: tree has shape {tuple(state['tree'].shape)}, "
                f"expected {tuple(self.tree.shape)} (capacity changed?)"
            )
        self.tree.copy_(state["tree"])
        self.max_priority.copy_(state["max_priority"])
        self.size.copy_(state["size"])
        if self.search == "tree":
            self._sum_levels()  # the checkpoint may come from a run that kept only the leaves


def raised(value: Tensor, power: float | Tensor) -> Tensor:
    """value^power; value itself where power is the number 1 (no kernel for it). In a pack, α may be each run's,
    a tensor."""
    return value if isinstance(power, float | int) and power == 1.0 else value.pow(power)


def max_of_duplicates(slots: Tensor, value: Tensor) -> Tensor:
    """value_b → max of the values of every b' with slots_b' = slots_b ([M], [M] -> [M]), by comparing every
    pair (M² of them: 1 M for a batch of 1024): for Inductor, one fused kernel."""
    same = slots[:, None] == slots[None, :]  # [M, M]
    return torch.where(same, value[None, :], float("-inf")).amax(dim=1)  # [M]


def sum_paths(trees: Tensor, rows: Tensor, leaves: Tensor, depth: int) -> None:
    """`PrioritizedSampler._sum_levels` over only the ancestors of changed leaves, for stacked trees.

    `trees` [R, 2P] holds R sum-trees (a pack's samplers), `leaves` [M] tree positions (slot + P) changed in
    tree `rows` [M]. Each ancestor n of a changed leaf gets tree[2n] + tree[2n+1], level by level, leaves up:
    the values a whole-level sum gives (every other node already holds its children's sum), at a cost that grows
    with M·log2(P), not with R·P. An ancestor shared by several leaves is written once per leaf with one value.
    """
    pairs = trees.view(trees.shape[0], -1, 2)  # [R, P, 2]: row n holds the children (2n, 2n+1) of node n
    node = leaves
    for _ in range(depth):
        node = node >> 1  # [M] the parents
        trees[rows, node] = pairs[rows, node, 0] + pairs[rows, node, 1]
