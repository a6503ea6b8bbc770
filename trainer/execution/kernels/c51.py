"""The C51 target distribution in one Triton kernel: the Double-DQN gather, the target softmax and the
categorical projection of each sample, one program per sample (issue 14's round 14, issue 32).

The same mathematics as `trainer.algo.losses.c51.target_distribution` (`categorical_projection` applied to
`softmax(next_logits[b, k, a*])`), executed differently. Under Inductor the projection is one reduction per
target atom (B·K·N = 156,672 rows of 51 at the `core` size) that reads the gathered logits and the softmax's
statistics again for each: the step's largest kernel, 60 µs of 0.756 ms on an H200 (round 13,
`docs/benchmarks/round13/f_profile_core.txt`), where its arithmetic is a few µs of work.

Here program b computes the shifted support's positions b_j [N] once, the triangle weights
w[j, i] = max(0, 1 - |b_j - i|) as one [N, N] tile in registers, and per branch k the softmax p [N] of the
logits at a*[b, k] and the target p · w [N]. No atomics: each output is one program's sum in a fixed order, so
the target is deterministic. Float32 throughout (the logits are read in their own dtype).

An opaque custom op (`foxhunt::c51_target`, with a fake for tracing), so Dynamo keeps the target graph whole
around it and a CUDA graph records its launch. The fused plans use it when `run.c51_target_kernel` is
`triton` (`trainer.execution.plans.fused.FusedPlan.hyper`), and so does a compiled pack whose runs share γ: under
vmap every sample of every run is one more program of the same launch (`_over_runs`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch._functorch.autograd_function import VmapInfo

from contracts.config import C51_KERNEL_MAX_ATOMS


def supports(atoms: int) -> bool:
    return 1 < atoms <= C51_KERNEL_MAX_ATOMS


@triton.jit
def _target_kernel(
    logits_ptr,
    action_ptr,
    reward_ptr,
    done_ptr,
    support_ptr,
    out_ptr,
    stride_b,
    stride_k,
    stride_a,
    gamma,
    BRANCHES: tl.constexpr,
    ATOMS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    j = tl.arange(0, BLOCK_N)  # source atoms
    i = tl.arange(0, BLOCK_N)  # target atoms
    in_atoms = j < ATOMS

    # tz = clamp(r + gamma (1 - done) z, v_min, v_max); b_j = clamp((tz - v_min) / dz, 0, N - 1)   [N]
    z = tl.load(support_ptr + j, mask=in_atoms, other=0.0)
    v_min = tl.load(support_ptr)
    v_max = tl.load(support_ptr + ATOMS - 1)
    dz = (v_max - v_min) / (ATOMS - 1)
    discount = gamma * (1.0 - tl.load(done_ptr + b))
    tz = tl.minimum(tl.maximum(tl.load(reward_ptr + b) + discount * z, v_min), v_max)
    position = tl.minimum(tl.maximum((tz - v_min) / dz, 0.0), ATOMS - 1.0)
    # w[j, i] = max(0, 1 - |b_j - i|)   [N(j), N(i)]; the padding past N carries no mass (p_j = 0 there)
    weight = tl.maximum(1.0 - tl.abs(position[:, None] - i[None, :].to(tl.float32)), 0.0)

    for k in tl.static_range(BRANCHES):
        action = tl.load(action_ptr + b * BRANCHES + k)
        row = logits_ptr + b * stride_b + k * stride_k + action * stride_a
        logit = tl.load(row + j, mask=in_atoms, other=float("-inf")).to(tl.float32)  # [N]
        # p = softmax(logits at a*)
        shifted = tl.exp(logit - tl.max(logit, axis=0))
        pmf = shifted / tl.sum(shifted, axis=0)  # [N], 0 past N
        # target_i = sum_j p_j w[j, i]
        target = tl.sum(pmf[:, None] * weight, axis=0)  # [N]
        tl.store(out_ptr + (b * BRANCHES + k) * ATOMS + i, target, mask=i < ATOMS)


@torch.library.custom_op("foxhunt::c51_target", mutates_args=())
def c51_target(
    next_logits: Tensor, a_star: Tensor, reward: Tensor, done: Tensor, gamma: float, support: Tensor
) -> Tensor:
    """`target_distribution` in one kernel: target_pmf [B, K, N] float32, the projection of
    softmax(next_logits[b, k, a_star[b, k]]) [N] for reward + gamma (1 - done) z onto `support` [N] (evenly
    spaced). next_logits [B, K, A, N] with unit stride over the atoms; a_star [B, K] int64; reward, done [B]."""
    batch, branches, _, atoms = next_logits.shape
    if not supports(atoms):
        raise ValueError(f"c51_target: at most {C51_KERNEL_MAX_ATOMS} atoms (and 2 or more), got {atoms}")
    if next_logits.stride(3) != 1:
        raise ValueError(f"c51_target: next_logits needs unit stride over the atoms, got {next_logits.stride()}")
    out = torch.empty(batch, branches, atoms, device=next_logits.device, dtype=torch.float32)
    block_n = triton.next_power_of_2(atoms)
    _target_kernel[(batch,)](
        next_logits,
        a_star.contiguous(),
        reward.float().contiguous(),
        done.float().contiguous(),
        support.float().contiguous(),
        out,
        next_logits.stride(0),
        next_logits.stride(1),
        next_logits.stride(2),
        gamma,
        BRANCHES=branches,
        ATOMS=atoms,
        BLOCK_N=block_n,
        num_warps=4 if block_n <= 64 else 8,
    )
    return out


@c51_target.register_fake
def _(next_logits: Tensor, a_star: Tensor, reward: Tensor, done: Tensor, gamma: float, support: Tensor) -> Tensor:
    batch, branches, _, atoms = next_logits.shape
    return next_logits.new_empty(batch, branches, atoms, dtype=torch.float32)


@c51_target.register_vmap
def _over_runs(
    info: VmapInfo,
    in_dims: tuple[int | None, ...],
    next_logits: Tensor,
    a_star: Tensor,
    reward: Tensor,
    done: Tensor,
    gamma: float,
    support: Tensor,
) -> tuple[Tensor, int]:
    """A pack's runs (`trainer.execution.pack`): each sample's target is its own program, so K runs' [K, B, ...]
    inputs are one launch over K·B samples. The support is the runs' shared one (v_min, v_max and the atoms are
    not packable, `contracts.packs.PACKABLE`)."""
    runs = info.batch_size

    def samples(tensor: Tensor, dim: int | None) -> Tensor:  # [K, B, ...] -> [K·B, ...]
        tensor = tensor.movedim(dim, 0) if dim is not None else tensor.expand(runs, *tensor.shape)
        return tensor.reshape(-1, *tensor.shape[2:])

    logits_dim, action_dim, reward_dim, done_dim, _, support_dim = in_dims
    shared = support if support_dim is None else support.select(support_dim, 0)
    target = c51_target(
        samples(next_logits, logits_dim).contiguous(),
        samples(a_star, action_dim),
        samples(reward, reward_dim),
        samples(done, done_dim),
        gamma,
        shared,
    )
    return target.view(runs, -1, *target.shape[1:]), 0
