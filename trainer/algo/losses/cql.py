"""Conservative Q-learning penalty (Kumar et al. 2020), CQL(H) on the expected Q of each branch.

Pushes down Q on actions the data did not take relative to the data action: zero only when the data
action dominates every other. Per sample ([B]); pure tensor ops, capture-safe.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.algo.losses._select import take
from trainer.algo.losses._shapes import expect_shape


def cql_penalty(q: Tensor, action: Tensor) -> Tensor:
    """Per-sample CQL penalty: mean over branches of logsumexp_a Q(s, a) - Q(s, a_data)."""
    sizes: dict[str, int] = {}
    expect_shape("cql_penalty", "q", q, "B K A", sizes)
    expect_shape("cql_penalty", "action", action, "B K", sizes)
    # penalty = logsumexp_a q - q[a_data], mean over K
    soft_max_q = torch.logsumexp(q, dim=-1)  # [B, K]
    data_q = take(q, action[:, :, None], dim=-1)  # [B, K]
    return (soft_max_q - data_q).mean(-1)  # [B]
