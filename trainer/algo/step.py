"""One training update, written once: every plan runs exactly this function.

`train_step(state, batch, draws, hp, flags)` reads the batch and the random draws, computes every
loss, the per-loss gradients clipped to their budgets, Adam, spectral norm, the guard, the target
EMA, the IQL and attention updates, and writes the results into `state` in place. It syncs nothing
to the host and branches only on host-known values (`flags`, `hp`), so a plan may capture it in a
CUDA graph, split it over streams, or compile it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from contracts.config import TrainConfig
from trainer.algo.batch import Batch
from trainer.algo.budgets import BUDGET_NAMES, AdamMoments, adam_update, combine_budgeted, ema, spectral_project
from trainer.algo.losses._select import take
from trainer.algo.losses.aux import next_state_loss
from trainer.algo.losses.c51 import c51_cross_entropy, double_dqn_action, expected_q, target_distribution
from trainer.algo.losses.causal import intervene, intervention_effects
from trainer.algo.losses.cql import cql_penalty
from trainer.algo.losses.ensemble import ensemble_loss
from trainer.algo.losses.iql import expectile_loss
from trainer.algo.losses.iqn import iqn_target, quantile_huber_loss
from trainer.algo.losses.vaccine import distribution_shift_penalty, fgsm_states
from trainer.algo.model import (
    ModelDims,
    ParamLayout,
    attention_predict,
    c51_logits,
    ensemble_logits,
    head_hidden,
    iql_value,
    iqn_quantiles,
    self_attention,
    trunk,
)
from trainer.algo.rng import uniform_
from trainer.algo.state import TrainState


class SectionTimer(Protocol):
    def section(self, name: str) -> contextlib.AbstractContextManager[None]: ...


class _NoTimer:
    def section(self, name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # traceable by torch.compile, unlike a generator


NO_TIMER: SectionTimer = _NoTimer()


def next_quantile_targets(
    p: dict[str, Tensor],
    h_next: Tensor,
    tau: Tensor,
    a_star: Tensor,
    reward: Tensor,
    done: Tensor,
    gamma: float,
    d: ModelDims,
) -> Tensor:
    """IQN's target r + γ (1 - done) Z_τ'(s', a*) [B, T', K] of the network with views `p`, from its h_s2 at s'
    (h_next [B, H]), the target taus [B, T'] and the Double-DQN action a* [B, K]."""
    return iqn_target(quantiles_at(iqn_quantiles(p, h_next, tau, d), a_star), reward, done, gamma)


def quantiles_at(z: Tensor, a_star: Tensor) -> Tensor:
    """Z_τ(s', a*) [B, T', K] of the quantiles z [B, T', K, A] at the Double-DQN action a* [B, K]."""
    return z.gather(3, a_star[:, None, :, None].expand(-1, z.shape[1], -1, 1)).squeeze(3)


@dataclass(frozen=True)
class Hyper:
    """The step's constants as plain Python values (baked into captured graphs)."""

    gamma: float
    reward_scale: float
    cql: bool
    cql_alpha: float
    iqn: bool
    kappa: float
    iql: bool
    expectile: float
    attention: bool
    ensemble: bool
    diversity: float
    vaccine_epsilon: float
    vaccine_weight: float
    budgets: dict[str, float]  # absolute norms: share × max_grad_norm
    lr: float
    aux_lr: float
    beta1: float
    beta2: float
    eps: float
    target_tau: float
    spectral_norm: bool
    sigma_max: float
    # The dtype of the networks' matrix products and attention (autocast, the output layers included,
    # their outputs cast to float32), None: float32 throughout. Master weights, gradients, Adam, spectral
    # norm, the C51 projection and every loss stay float32.
    autocast: torch.dtype | None = None
    # How the attention model's self-attention runs, not what it is: the fused plans swap in the Triton
    # kernels (`trainer.execution.kernels.window_attention`).
    attend: Callable[[Tensor], Tensor] = self_attention
    # How the C51 target is computed, not what it is: by run.c51_target_kernel (auto, triton) the fused plans swap
    # in one Triton kernel (`trainer.execution.kernels.c51`).
    c51_target: Callable[..., Tensor] = target_distribution
    # How IQN's target quantiles are computed: None, as written (`next_quantile_targets`, its products and its gather
    # apart, as the graphs measured without the kernel have them); by run.iqn_target_kernel (auto under bf16, triton)
    # the fused plans give one Triton kernel for all of it (`trainer.execution.kernels.iqn`).
    iqn_target: Callable[..., Tensor] | None = None
    # How the online pass's Z_τ(s, a) is computed, with its gradient: None, as written (`iqn_quantiles` and the gather
    # at the batch's actions); by run.iqn_online_kernel (triton) the fused plans give a forward and two backward
    # Triton kernels (`trainer.execution.kernels.iqn.quantiles_at_fused`).
    iqn_online: Callable[..., Tensor] | None = None
    # How the target pass's networks run (the online and target trunks and C51 heads at s and s', no gradient): None,
    # as written (`trunk`, `c51_logits`); by run.target_mlp_kernel (triton) the fused plans give one Triton kernel for
    # the whole chain (`trainer.execution.kernels.mlp.target_networks`), returning (h, logits) as the two do.
    target_networks: Callable[..., tuple[Tensor, Tensor]] | None = None

    @classmethod
    def from_config(cls, config: TrainConfig) -> Hyper:
        """The fields below are named or computed differently from the config; every other field is
        the `loss` or `optim` field of the same name (no name is in both sections)."""
        loss, optim = config.loss, config.optim
        derived: dict[str, Any] = {
            "kappa": loss.iqn_kappa,
            "expectile": loss.iql_expectile,
            "diversity": loss.ensemble_diversity,
            "ensemble": config.model.ensemble_heads > 0,
            "budgets": {
                "c51": optim.budget_c51 * optim.max_grad_norm,
                "cql": optim.budget_cql * optim.max_grad_norm,
                "iqn": optim.budget_iqn * optim.max_grad_norm,
                "ensemble": optim.budget_ensemble * optim.max_grad_norm,
            },
            "autocast": torch.bfloat16 if config.run.precision == "bf16" else None,
            "attend": self_attention,
            "c51_target": target_distribution,
            "iqn_target": None,
            "iqn_online": None,
            "target_networks": None,
        }
        sections = {**loss.model_dump(), **optim.model_dump()}
        copied = {f.name: sections[f.name] for f in fields(cls) if f.name not in derived}
        return cls(**copied, **derived)


@dataclass(frozen=True)
class StepFlags:
    """Periodic parts of the step, decided on the host from the step number."""

    vaccine: bool = False
    causal: bool = False

    @classmethod
    def for_step(cls, step: int, config: TrainConfig) -> StepFlags:
        loss = config.loss
        return cls(
            vaccine=loss.vaccine and step % loss.vaccine_every == 0,
            causal=loss.causal and step % loss.causal_every == 0,
        )


@dataclass
class Draws:
    """The step's random numbers, drawn outside the maths so plans can replay identical draws."""

    tau: Tensor  # [B, T] online quantile fractions
    tau_target: Tensor  # [B, T'] target quantile fractions
    perm: Tensor  # [B] int64 shuffle for the causal interventions
    uniform: Tensor
    """[B·T + B·T' + B]: every uniform draw of a step in one buffer, of which `tau`, `tau_target` and the
    B sort keys of `perm` are views, so a step's draws are one kernel (on the CPU, the same numbers as
    three draws in that order)."""
    permute: bool = True
    """Redraw `perm` (a sort of B keys) in `fill_`; off where no step intervenes (causal off), so the
    sort leaves the step. The keys are drawn either way: the random stream is the same."""

    @classmethod
    def empty(cls, dims: ModelDims, batch_size: int, device: torch.device, permute: bool = True) -> Draws:
        taus, target_taus = batch_size * dims.iqn_taus, batch_size * dims.iqn_target_taus
        uniform = torch.empty(taus + target_taus + batch_size, device=device)
        return cls(
            tau=uniform[:taus].view(batch_size, dims.iqn_taus),
            tau_target=uniform[taus : taus + target_taus].view(batch_size, dims.iqn_target_taus),
            perm=torch.arange(batch_size, dtype=torch.int64, device=device),
            uniform=uniform,
            permute=permute,
        )

    def fill_(self, generator: torch.Generator) -> Draws:
        """Redraw in place (capture-safe: no reallocation, no host sync)."""
        uniform_(self.uniform, generator)
        if self.permute:
            keys = self.uniform[-self.perm.shape[0] :]  # [B]
            self.perm.copy_(keys.argsort())
        return self


@dataclass
class StepOutput:
    losses: dict[str, Tensor]  # scalar tensors, IS-weighted batch means
    priority: Tensor  # [B] per-sample loss for PER write-back (finite)
    ok: Tensor  # [] bool: every group's update was applied


def _commit(ok: Tensor, pairs: list[tuple[Tensor, Tensor]]) -> None:
    """dst ← where(ok, new, dst) for every pair: the guard's skip, on the device."""
    for dst, new in pairs:
        dst.copy_(torch.where(ok, new, dst))


class Targets(NamedTuple):
    """What the update regresses towards, from the target network (no gradients). A NamedTuple, as
    Dynamo can rebuild one that lives across a graph break (the fused plan's stream sections)."""

    target_pmf: Tensor  # [B, K, N] projected C51 target
    q_target_obs: Tensor | None  # [B, K, A] target network's expected returns at s (IQL's target; None: IQL off)
    z_target: Tensor | None  # [B, T', K] IQN target quantiles (None when IQN is off)


class Forward(NamedTuple):
    """What the rest of the step reads from the online forward pass (a pytree: `jacrev`'s aux)."""

    budgeted: Tensor  # [L] the budgeted losses, in `budget_names` order
    losses: dict[str, Tensor]  # every main-network loss (the vaccine penalty on its own)
    h_s2: Tensor  # [B, H] online trunk features (IQL's input)
    q: Tensor  # [B, K, A] online expected returns (causal effects)
    per_sample: Tensor  # [B] the priority source: IQN's per-sample loss if on, else C51's


def mixed_precision(hp: Hyper, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """The networks' matrix products and attention in `hp.autocast` (bf16 operands, float32 master
    weights: their gradients come back through the casts as float32), or a no-op for float32."""
    if hp.autocast is None:
        return contextlib.nullcontext()
    # No cast cache: the casts are recomputed inside each captured graph (what CUDA graphs need).
    return torch.autocast(device.type, dtype=hp.autocast, cache_enabled=False)


def network_views(layout: ParamLayout, flat: Tensor, hp: Hyper) -> dict[str, Tensor]:
    """`layout`'s views of `flat` [P] (or of S stacked networks [S, P]) for the forward functions; under
    mixed precision of `flat` cast once to `hp.autocast` (one kernel, and one cast of its gradient back),
    where autocast would cast each weight at each of its uses. The same rounding as autocast's: bf16
    operands, float32 accumulation."""
    return layout.views(flat if hp.autocast is None else flat.to(hp.autocast))


def budget_names(hp: Hyper) -> list[str]:
    """The budgeted losses this configuration computes, in BUDGET_NAMES order."""
    enabled = {"c51": True, "cql": hp.cql, "iqn": hp.iqn, "ensemble": hp.ensemble}
    return [name for name in BUDGET_NAMES if enabled[name]]


@torch.no_grad()
def compute_targets(state: TrainState, batch: Batch, draws: Draws, hp: Hyper) -> Targets:
    d, atoms, rows = state.dims, state.atoms, batch.obs.shape[0]
    reward = batch.reward * hp.reward_scale  # [B]
    # The online and target networks stacked [2, P]: each layer of the two passes is one batched product.
    both = network_views(state.main, torch.stack([state.online, state.target]), hp)
    with mixed_precision(hp, atoms.device):  # the networks; their outputs are float32
        states = torch.cat([batch.obs, batch.next_obs]).expand(2, -1, -1)  # [2, 2B, F]: s and s' for each network
        if hp.target_networks is None:
            h = trunk(both, states)  # [2, 2B, H]
            logits = c51_logits(both, h, d)  # [2, 2B, K, A, N]
        else:  # a plan's one kernel for both (`Hyper.target_networks`)
            h, logits = hp.target_networks(both, states, d)
        # Double DQN: a* = argmax_a E[Z_online(s', a)], evaluated by the target network.
        a_star = double_dqn_action(logits[0, rows:], atoms)  # [B, K]
        target_logits, next_logits = logits[1, :rows], logits[1, rows:]  # [B, K, A, N] at s (IQL's), at s'
        pt = {name: view[1] for name, view in both.items()}  # the target network's own views
        # IQN's target: as written, the products here and the gather after the C51 target (the order of every
        # measured graph); or a plan's kernel for all of it (`Hyper.iqn_target`)
        z_next = z_target = None
        if hp.iqn and hp.iqn_target is None:
            z_next = iqn_quantiles(pt, h[1, rows:], draws.tau_target, d)  # [B, T', K, A]
        elif hp.iqn and hp.iqn_target is not None:
            z_target = hp.iqn_target(pt, h[1, rows:], draws.tau_target, a_star, reward, batch.done, hp.gamma, d)
    q_target_obs = expected_q(target_logits, atoms) if hp.iql else None  # [B, K, A]
    target_pmf = hp.c51_target(next_logits, a_star, reward, batch.done, hp.gamma, atoms)  # [B, K, N], float32
    if z_next is not None:
        z_target = iqn_target(quantiles_at(z_next, a_star), reward, batch.done, hp.gamma)  # [B, T', K]
    return Targets(target_pmf=target_pmf, q_target_obs=q_target_obs, z_target=z_target)


def head_losses(
    online: Tensor,
    state: TrainState,
    batch: Batch,
    flags: StepFlags,
    hp: Hyper,
    targets: Targets,
) -> tuple[Tensor, Forward]:
    """The budgeted losses of the heads on one trunk forward (C51 with the vaccine penalty, CQL, the
    ensemble) as a function of the online parameters [Pm], in `budget_names` order without IQN; and
    what the rest of the step reads from the same forward pass."""
    d, atoms, weight = state.dims, state.atoms, batch.weight  # weight: [B] importance sampling
    p = network_views(state.main, online, hp)
    losses: dict[str, Tensor] = {}

    def c51_of_states(obs: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor, Tensor]]:
        h = trunk(p, obs)  # [B, H]
        hidden = head_hidden(p, h, d, ensemble=hp.ensemble)  # [B, (2(+E))·h]: every head's first layer at once
        logits = c51_logits(p, h, d, hidden)  # [B, K, A, N]
        per_sample = c51_cross_entropy(logits, batch.action, targets.target_pmf)  # [B]
        return (weight * per_sample).mean(), (h, logits, per_sample, hidden)

    if flags.vaccine:
        # FGSM needs ∇_s L_c51: the same forward, differentiated w.r.t. the states as well.
        losses["c51"], grad_of_states, (h_s2, logits, c51_per_sample, hidden) = torch.func.vjp(  # type: ignore[misc]
            c51_of_states, batch.obs, has_aux=True
        )  # with has_aux, vjp returns (output, vjp_fn, aux); its stub knows only the pair
        (grad_obs,) = grad_of_states(torch.ones_like(losses["c51"]))  # [B, F]
    else:
        losses["c51"], (h_s2, logits, c51_per_sample, hidden) = c51_of_states(batch.obs)
    q = expected_q(logits, atoms)  # [B, K, A]
    budgeted = {"c51": losses["c51"]}
    if hp.cql:
        losses["cql"] = budgeted["cql"] = hp.cql_alpha * (weight * cql_penalty(q, batch.action)).mean()

    if hp.ensemble:
        heads = ensemble_logits(p, h_s2, d, hidden)  # [E, B, K, A, N]
        per_sample = ensemble_loss(heads, batch.action, targets.target_pmf, atoms, hp.diversity)  # [B]
        losses["ensemble"] = budgeted["ensemble"] = (weight * per_sample).mean()

    if flags.vaccine:
        # s_adv = s + ε sign(∇_s L_c51); penalise KL(Z(s) ‖ Z(s_adv)) within the C51 budget.
        adv_logits = c51_logits(p, trunk(p, fgsm_states(batch.obs, grad_obs, hp.vaccine_epsilon)), d)
        losses["vaccine"] = hp.vaccine_weight * (weight * distribution_shift_penalty(logits, adv_logits)).mean()
        budgeted["c51"] = losses["c51"] + losses["vaccine"]

    stacked = torch.stack([budgeted[name] for name in budget_names(hp) if name in budgeted])  # [L]
    return stacked, Forward(budgeted=stacked, losses=losses, h_s2=h_s2, q=q, per_sample=c51_per_sample)


def iqn_loss(
    online: Tensor, state: TrainState, batch: Batch, draws: Draws, hp: Hyper, targets: Targets
) -> tuple[Tensor, Tensor]:
    """The IQN loss (and its per-sample values [B]) as a function of the online parameters [Pm]: the
    definition `per_loss_gradients` differentiates in two parts (the test's reference)."""
    p = network_views(state.main, online, hp)
    return iqn_loss_of_features(online, trunk(p, batch.obs), state, batch, draws, hp, targets)


def iqn_loss_of_features(
    online: Tensor, h_s2: Tensor, state: TrainState, batch: Batch, draws: Draws, hp: Hyper, targets: Targets
) -> tuple[Tensor, Tensor]:
    """`iqn_loss` past the trunk: of the online parameters [Pm] (IQN's own layers) and the trunk features
    h_s2 [B, H], whose gradient carries IQN's share of the trunk's."""
    assert targets.z_target is not None
    p = network_views(state.main, online, hp)
    if hp.iqn_online is None:
        z = iqn_quantiles(p, h_s2, draws.tau, state.dims)  # [B, T, K, A]
        z_data = take(z, batch.action[:, None, :, None], dim=3)  # [B, T, K]
    else:
        z_data = hp.iqn_online(p, h_s2, draws.tau, batch.action, state.dims)  # [B, T, K]
    per_sample = quantile_huber_loss(z_data, targets.z_target, draws.tau, hp.kappa)  # [B]
    return (batch.weight * per_sample).mean(), per_sample


def heads_and_features(
    online: Tensor, state: TrainState, batch: Batch, flags: StepFlags, hp: Hyper, targets: Targets
) -> tuple[tuple[Tensor, Tensor], Forward]:
    """`head_losses`, with the trunk features h_s2 [B, H] as a second output: a cotangent on them is
    pushed back through the trunk by the same backward as the heads' losses."""
    stacked, fwd = head_losses(online, state, batch, flags, hp, targets)
    return (stacked, fwd.h_s2), fwd


def per_loss_gradients(
    state: TrainState,
    batch: Batch,
    draws: Draws,
    hp: Hyper,
    flags: StepFlags,
    targets: Targets,
    timer: SectionTimer = NO_TIMER,
) -> tuple[dict[str, Tensor], Forward]:
    """∂L_i/∂θ [Pm] for every budgeted loss, and the forward pass's outputs; timed as the sections
    "forward_backward" (the trunk, the heads, ensemble and vaccine) and "iqn" (IQN's own layers).

    One trunk forward serves every loss. The heads' losses share one batched backward: the rows of
    their Jacobian. IQN's own layers get a backward of their own, from the trunk's features: they see
    B·T rows, and in a batched backward their weight gradients become batched matrix products with a
    B·T-long reduction that cuBLAS runs without split-K, ten times slower on an H200 than one plain
    backward. Its gradient with respect to the features then joins the heads' backward as one more
    row, so the trunk is run forward once and backward once for all of them.
    """
    names = [name for name in budget_names(hp) if name != "iqn"]
    if not hp.iqn:
        with timer.section("forward_backward"), mixed_precision(hp, state.atoms.device):
            jacobian, fwd = torch.func.jacrev(head_losses, has_aux=True)(state.online, state, batch, flags, hp, targets)
        return dict(zip(names, jacobian.unbind(0), strict=True)), fwd  # name -> [Pm]

    def heads(online: Tensor) -> tuple[tuple[Tensor, Tensor], Forward]:
        return heads_and_features(online, state, batch, flags, hp, targets)

    with timer.section("forward_backward"), mixed_precision(hp, state.atoms.device):
        # outputs [L] and [B, H]; with has_aux, vjp returns (output, vjp_fn, aux): its stub knows only the pair
        (stacked, h_s2), backward, fwd = torch.func.vjp(heads, state.online, has_aux=True)  # type: ignore[misc]
    with timer.section("iqn"), mixed_precision(hp, state.atoms.device):
        # IQN's own layers [Pm] and ∂L_iqn/∂h_s2 [B, H], from the features the heads saw
        (iqn_layers, iqn_features), (loss, per_sample) = torch.func.grad_and_value(
            iqn_loss_of_features, argnums=(0, 1), has_aux=True
        )(state.online, fwd.h_s2, state, batch, draws, hp, targets)
    with timer.section("forward_backward"), mixed_precision(hp, state.atoms.device):
        rows = len(names)
        loss_rows = torch.eye(rows + 1, rows, dtype=stacked.dtype, device=stacked.device)  # [L+1, L]: IQN's last, 0
        feature_rows = torch.cat([iqn_features.new_zeros(rows, *h_s2.shape), iqn_features[None]])  # [L+1, B, H]
        (jacobian,) = torch.func.vmap(backward)((loss_rows, feature_rows))  # [L+1, Pm]
    grads = dict(zip(names, jacobian[:rows].unbind(0), strict=True))  # name -> [Pm]
    grads["iqn"] = jacobian[rows] + iqn_layers  # the trunk's share + IQN's own layers
    by_name = {**dict(zip(names, fwd.budgeted.unbind(0), strict=True)), "iqn": loss}
    budgeted = torch.stack([by_name[name] for name in budget_names(hp)])  # [L]
    # A new Forward, not `fwd._replace`: Dynamo (torch 2.11) cannot rebuild _replace's object at a graph break.
    losses = {**fwd.losses, "iqn": loss}
    return grads, Forward(budgeted=budgeted, losses=losses, h_s2=fwd.h_s2, q=fwd.q, per_sample=per_sample)


def train_step(
    state: TrainState,
    batch: Batch,
    draws: Draws,
    hp: Hyper,
    flags: StepFlags = StepFlags(),
    timer: SectionTimer = NO_TIMER,
) -> StepOutput:
    d, atoms = state.dims, state.atoms

    with timer.section("forward_backward"):
        targets = compute_targets(state, batch, draws, hp)
    grads, fwd = per_loss_gradients(state, batch, draws, hp, flags, targets, timer)
    losses = dict(fwd.losses)
    # PER's new priorities, finite whatever the guard decides; here, before the plans' first graph break,
    # so compiled it is one more output of the kernel that computes the per-sample losses.
    priority = torch.nan_to_num(fwd.per_sample.detach(), nan=0.0, posinf=0.0, neginf=0.0)  # [B]

    if flags.causal:
        with timer.section("causal"), torch.no_grad(), mixed_precision(hp, atoms.device):
            # do(s_f := shuffled s_f) for each feature f; effect_f = mean |Q(do) − Q|.
            p = network_views(state.main, state.online, hp)
            intervened = intervene(batch.obs, draws.perm)  # [F, B, F]
            q_do = expected_q(c51_logits(p, trunk(p, intervened.flatten(0, 1)), d), atoms)  # [F·B, K, A]
            state.causal_effects.copy_(intervention_effects(fwd.q, q_do.view(d.obs_dim, *fwd.q.shape)))

    # IQL and attention read the pre-update trunk and target; every group commits at the guard.
    # Each section's work is one function call: where a plan breaks Dynamo's graph at a section (the fused
    # plan's streams), Dynamo runs the rest of this frame as Python and compiles each call whole.
    updates: list[tuple[Tensor, Tensor]] = []
    checks: list[Tensor] = []
    if hp.iql:
        with timer.section("iql"):
            losses["iql"], pairs, checked = iql_update(state, batch, hp, targets, fwd.h_s2)
            updates += pairs
            checks += checked
    if hp.attention:
        with timer.section("attention"):
            losses["attention"], pairs, checked = attention_update(state, batch, hp)
            updates += pairs
            checks += checked
    pairs, checked = main_update(state, grads, fwd, hp, timer)
    updates += pairs
    checks += checked

    with timer.section("guard"), torch.no_grad():
        ok = guard_commit(state, updates, checks)

    return StepOutput(losses=losses, priority=priority, ok=ok)


Pairs = list[tuple[Tensor, Tensor]]
"""(state tensor, its new value) for the guard to commit."""


def iql_update(
    state: TrainState, batch: Batch, hp: Hyper, targets: Targets, h_s2: Tensor
) -> tuple[Tensor, Pairs, list[Tensor]]:
    """IQL's loss [], its Adam step as pairs to commit, and what the guard checks."""
    assert targets.q_target_obs is not None
    q_target_data = targets.q_target_obs.gather(2, batch.action[:, :, None]).squeeze(2).mean(1)  # [B]

    def iql_loss(params: Tensor) -> Tensor:
        value = iql_value(network_views(state.iql, params, hp), h_s2)  # [B]
        return (batch.weight * expectile_loss(value, q_target_data, hp.expectile)).mean()

    return aux_adam_step(state, hp, state.iql_params, state.adam_iql, iql_loss)


def attention_update(state: TrainState, batch: Batch, hp: Hyper) -> tuple[Tensor, Pairs, list[Tensor]]:
    """The attention model's loss [], its Adam step as pairs to commit, and what the guard checks."""

    def attention_loss(params: Tensor) -> Tensor:
        views = network_views(state.attn, params, hp)
        prediction = attention_predict(views, batch.window, state.dims, hp.attend)  # [B, F]
        return (batch.weight * next_state_loss(prediction, batch.next_obs)).mean()

    return aux_adam_step(state, hp, state.attn_params, state.adam_attn, attention_loss)


def aux_adam_step(
    state: TrainState, hp: Hyper, params: Tensor, moments: AdamMoments, loss_fn: Callable[[Tensor], Tensor]
) -> tuple[Tensor, Pairs, list[Tensor]]:
    """An auxiliary network's loss [] (`loss_fn` of its flat parameters [P]), its Adam step at `aux_lr` as
    pairs to commit, and what the guard checks."""
    with mixed_precision(hp, state.atoms.device):
        grad, loss = torch.func.grad_and_value(loss_fn)(params)  # [P], []
    new, m, v = adam_update(params, grad, moments, state.updates + 1, hp.aux_lr, hp.beta1, hp.beta2, hp.eps)
    return loss, [(params, new), (moments.m, m), (moments.v, v)], [grad, loss[None]]


def main_update(
    state: TrainState, grads: dict[str, Tensor], fwd: Forward, hp: Hyper, timer: SectionTimer
) -> tuple[Pairs, list[Tensor]]:
    """The main network's budget clipping, pruning, Adam and spectral norm, and the target network's
    EMA towards the result, as pairs to commit; and what the guard checks."""
    with timer.section("clip_prune"):
        grad = combine_budgeted(grads, hp.budgets) * state.prune_mask  # [Pm]

    with timer.section("adam"):
        candidate, m, v = adam_update(
            state.online, grad, state.adam_main, state.updates + 1, hp.lr, hp.beta1, hp.beta2, hp.eps
        )

    with timer.section("spectral"):
        right_vectors = state.spectral_v  # [ΣC]
        if hp.spectral_norm:
            candidate, right_vectors = spectral_project(candidate, state.spectral_v, state.main, hp.sigma_max)

    with timer.section("ema"):
        # target ← lerp(target, online, τ) of the online parameters this update commits: committed with them
        # (compiled, one more output of the kernel that writes the candidate, not a pass of its own).
        target = ema(state.target, candidate, hp.target_tau)  # [Pm]

    pairs = [(state.online, candidate), (state.adam_main.m, m), (state.adam_main.v, v)]
    pairs += [(state.spectral_v, right_vectors), (state.target, target)]
    return pairs, [grad, candidate, fwd.budgeted]


def guard_commit(state: TrainState, updates: Pairs, checks: list[Tensor]) -> Tensor:
    """Commit every update only if every check is finite: ok [] bool."""
    # Any non-finite loss or gradient skips the whole update on the device: torch.where, no host branch.
    ok = torch.stack([torch.isfinite(tensor).all() for tensor in checks]).all()  # []
    _commit(ok, updates)
    state.updates.add_(ok.to(state.updates.dtype))
    state.guard_skips.add_((~ok).to(state.guard_skips.dtype))
    return ok
