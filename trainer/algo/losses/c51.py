"""C51 (Bellemare et al. 2017) with a dueling, branching head and a Double-DQN target.

Pure tensor functions: no `.item()`, no branch on tensor values, no per-sample loop, so each one runs
unchanged under torch.compile and CUDA graph capture. All losses are per sample ([B]); the caller
weights them by the PER importance weights and averages.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.algo.losses._select import take
from trainer.algo.losses._shapes import expect_shape


def categorical_projection(next_pmf: Tensor, reward: Tensor, done: Tensor, gamma: float, support: Tensor) -> Tensor:
    """Project the Bellman-shifted target distribution back onto the fixed support (the C51 target).

    next_pmf [B, K, N] is the target net's distribution at the Double-DQN action a*; done is 1.0 on
    terminal transitions; support [N] is evenly spaced from v_min to v_max. Rows of the result sum to 1.
    """
    sizes: dict[str, int] = {}
    expect_shape("categorical_projection", "next_pmf", next_pmf, "B K N", sizes)
    expect_shape("categorical_projection", "reward", reward, "B", sizes)
    expect_shape("categorical_projection", "done", done, "B", sizes)
    expect_shape("categorical_projection", "support", support, "N", sizes)
    N = next_pmf.shape[-1]
    v_min, v_max = support[0], support[-1]
    dz = (v_max - v_min) / (N - 1)

    # tz = clamp(r + gamma (1 - done) z, v_min, v_max)
    discount = gamma * (1.0 - done)  # [B]
    tz = reward[:, None] + discount[:, None] * support[None, :]  # [B, N]
    tz = torch.clamp(tz, v_min, v_max)
    # b = (tz - v_min) / dz; clamped so rounding cannot push it past the last atom
    b = ((tz - v_min) / dz).clamp(0, N - 1)  # [B, N]
    # The mass of source atom j lands on atoms lower = floor(b_j) and upper = ceil(b_j) with weights
    # (upper - b_j) and (b_j - lower), all of it on b_j when b_j is integral: exactly the triangle
    # w_ji = max(0, 1 - |b_j - i|). As a product and a sum over j it has no atomics, so the target is
    # bit-reproducible on the GPU (index_add is not), and a NaN b poisons only its own sample. Written
    # as a broadcast and a sum, not bmm: compiled, it is one Triton reduction that builds w on the fly,
    # where cuBLAS ran 1024 products of [K, N] × [N, N] in tiles of 64 × 256 (39 µs on an H200).
    atom = torch.arange(N, device=next_pmf.device, dtype=b.dtype)  # [N]
    weight = (1.0 - (b[:, :, None] - atom[None, None, :]).abs()).clamp(min=0.0)  # [B, N(j), N(i)]
    return (next_pmf[:, :, :, None] * weight[:, None, :, :].to(next_pmf.dtype)).sum(2)  # [B, K, N]


def target_distribution(
    next_logits: Tensor, a_star: Tensor, reward: Tensor, done: Tensor, gamma: float, support: Tensor
) -> Tensor:
    """The C51 target: the target net's distribution at the Double-DQN action, softmax(next_logits[a*]),
    projected onto the support for reward + gamma (1 - done) z. next_logits [B, K, A, N], a_star [B, K]."""
    sizes: dict[str, int] = {}
    expect_shape("target_distribution", "next_logits", next_logits, "B K A N", sizes)
    expect_shape("target_distribution", "a_star", a_star, "B K", sizes)
    index = a_star[:, :, None, None].expand(-1, -1, 1, next_logits.shape[-1])  # [B, K, 1, N]
    next_pmf = next_logits.gather(2, index).squeeze(2).softmax(-1)  # [B, K, N]
    return categorical_projection(next_pmf, reward, done, gamma, support)  # [B, K, N]


def expected_q(logits: Tensor, support: Tensor) -> Tensor:
    """Q(s, a) = sum_n softmax(logits)_n z_n, per branch and action."""
    sizes: dict[str, int] = {}
    expect_shape("expected_q", "logits", logits, "B K A N", sizes)
    expect_shape("expected_q", "support", support, "N", sizes)
    # q = sum_n p_n z_n
    return (torch.softmax(logits, dim=-1) * support).sum(-1)  # [B, K, A]


def double_dqn_action(next_logits_online: Tensor, support: Tensor) -> Tensor:
    """a* = argmax_a of the ONLINE net's expected Q at s' (Double DQN: online picks, target evaluates).

    `support` is needed because the expected Q, not the logits, is what is maximised.
    """
    # a* = argmax_a sum_n p_online(s', a)_n z_n
    q_next_online = expected_q(next_logits_online, support)  # [B, K, A]
    return q_next_online.argmax(-1)  # [B, K]


def c51_cross_entropy(logits: Tensor, action: Tensor, target_pmf: Tensor) -> Tensor:
    """Per-sample C51 loss: mean over branches of -sum_n target_pmf_n log p(s, a_data)_n.

    target_pmf is detached here, so gradients reach only the online logits.
    """
    sizes: dict[str, int] = {}
    expect_shape("c51_cross_entropy", "logits", logits, "B K A N", sizes)
    expect_shape("c51_cross_entropy", "action", action, "B K", sizes)
    expect_shape("c51_cross_entropy", "target_pmf", target_pmf, "B K N", sizes)
    # logits at the data action
    chosen = take(logits, action[:, :, None, None], dim=2)  # [B, K, N]
    # loss = -sum_n target_n log softmax(chosen)_n, mean over K
    log_p = torch.log_softmax(chosen, dim=-1)  # [B, K, N]
    cross_entropy = -(target_pmf.detach() * log_p).sum(-1)  # [B, K]
    return cross_entropy.mean(-1)  # [B]


def dueling_logits(value: Tensor, advantage: Tensor) -> Tensor:
    """Dueling combine per branch and atom: V + A - mean_a A (identifiable: advantages average to 0).

    value is [B, K, 1, N] (one value stream per branch) or [B, 1, 1, N] (shared across branches).
    """
    sizes: dict[str, int] = {}
    expect_shape("dueling_logits", "advantage", advantage, "B K A N", sizes)
    B, K, _, N = advantage.shape
    if value.dim() != 4 or value.shape[0] != B or value.shape[1] not in (1, K) or value.shape[2:] != (1, N):
        raise ValueError(
            f"dueling_logits: value must be [B, K, 1, N] or [B, 1, 1, N] with B={B}, K={K}, N={N}, "
            f"got shape {tuple(value.shape)}"
        )
    # logits = V + A - mean_a A
    return value + advantage - advantage.mean(dim=2, keepdim=True)  # [B, K, A, N]
