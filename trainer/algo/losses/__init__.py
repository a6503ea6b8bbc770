"""The trainer's losses as small pure tensor functions: tensors in, per-sample losses [B] out.

No optimiser, stream, `.item()` or branch on tensor values lives here, so `trainer/algo/step.py` can run
them eagerly, under torch.compile or inside a CUDA graph. Shape letters as in docs/architecture.md ("Conventions").
"""

from trainer.algo.losses.aux import next_state_loss
from trainer.algo.losses.c51 import (
    c51_cross_entropy,
    categorical_projection,
    double_dqn_action,
    dueling_logits,
    expected_q,
    target_distribution,
)
from trainer.algo.losses.causal import intervene, intervention_effects
from trainer.algo.losses.cql import cql_penalty
from trainer.algo.losses.ensemble import ensemble_loss
from trainer.algo.losses.iql import expectile_loss
from trainer.algo.losses.iqn import cosine_features, iqn_target, quantile_huber_loss
from trainer.algo.losses.vaccine import distribution_shift_penalty, fgsm_states

__all__ = [
    "c51_cross_entropy",
    "categorical_projection",
    "cosine_features",
    "cql_penalty",
    "distribution_shift_penalty",
    "double_dqn_action",
    "dueling_logits",
    "ensemble_loss",
    "expected_q",
    "expectile_loss",
    "fgsm_states",
    "intervene",
    "intervention_effects",
    "iqn_target",
    "next_state_loss",
    "quantile_huber_loss",
    "target_distribution",
]
