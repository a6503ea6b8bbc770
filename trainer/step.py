"""One training update, written once: every plan runs exactly this function (STYLE rule 3).

`train_step(state, batch, draws, hp, flags)` reads the batch and the random draws, computes every
loss, the per-loss gradients clipped to their budgets, Adam, spectral norm, the guard, the target
EMA, the IQL and attention updates, and writes the results into `state` in place. It syncs nothing
to the host and branches only on host-known values (`flags`, `hp`), so a plan may capture it in a
CUDA graph, split it over streams, or compile it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from trainer.batch import Batch
from trainer.budgets import adam_update, combine_budgeted, ema, spectral_project
from trainer.config import TrainConfig
from trainer.losses.aux import next_state_loss
from trainer.losses.c51 import c51_cross_entropy, categorical_projection, double_dqn_action, expected_q
from trainer.losses.causal import intervene, intervention_effects
from trainer.losses.cql import cql_penalty
from trainer.losses.ensemble import ensemble_loss
from trainer.losses.iql import expectile_loss
from trainer.losses.iqn import iqn_target, quantile_huber_loss
from trainer.losses.vaccine import distribution_shift_penalty, fgsm_states
from trainer.model import (
    ModelDims,
    attention_predict,
    c51_logits,
    ensemble_logits,
    iql_value,
    iqn_quantiles,
    trunk,
)
from trainer.state import TrainState


class SectionTimer(Protocol):
    def section(self, name: str) -> contextlib.AbstractContextManager[None]: ...


class _NoTimer:
    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        yield


NO_TIMER: SectionTimer = _NoTimer()


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

    @classmethod
    def from_config(cls, config: TrainConfig) -> Hyper:
        loss, optim = config.loss, config.optim
        return cls(
            gamma=loss.gamma,
            reward_scale=loss.reward_scale,
            cql=loss.cql,
            cql_alpha=loss.cql_alpha,
            iqn=loss.iqn,
            kappa=loss.iqn_kappa,
            iql=loss.iql,
            expectile=loss.iql_expectile,
            attention=loss.attention,
            ensemble=config.model.ensemble_heads > 0,
            diversity=loss.ensemble_diversity,
            vaccine_epsilon=loss.vaccine_epsilon,
            vaccine_weight=loss.vaccine_weight,
            budgets={
                "c51": optim.budget_c51 * optim.max_grad_norm,
                "cql": optim.budget_cql * optim.max_grad_norm,
                "iqn": optim.budget_iqn * optim.max_grad_norm,
                "ensemble": optim.budget_ensemble * optim.max_grad_norm,
            },
            lr=optim.lr,
            aux_lr=optim.aux_lr,
            beta1=optim.beta1,
            beta2=optim.beta2,
            eps=optim.eps,
            target_tau=optim.target_tau,
            spectral_norm=optim.spectral_norm,
            sigma_max=optim.sigma_max,
        )


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

    @classmethod
    def empty(cls, dims: ModelDims, batch_size: int, device: torch.device) -> Draws:
        return cls(
            tau=torch.empty(batch_size, dims.iqn_taus, device=device),
            tau_target=torch.empty(batch_size, dims.iqn_target_taus, device=device),
            perm=torch.empty(batch_size, dtype=torch.int64, device=device),
        )

    def fill_(self, generator: torch.Generator) -> Draws:
        """Redraw in place (capture-safe: no reallocation, no host sync)."""
        self.tau.uniform_(generator=generator)
        self.tau_target.uniform_(generator=generator)
        keys = torch.rand(self.perm.shape, generator=generator, device=self.perm.device)  # [B]
        self.perm.copy_(keys.argsort())
        return self


@dataclass
class StepOutput:
    losses: dict[str, Tensor]  # scalar tensors, IS-weighted batch means
    priority: Tensor  # [B] per-sample loss for PER write-back (finite)
    ok: Tensor  # [] bool: every group's update was applied


def per_loss_gradients(losses: dict[str, Tensor], params: Tensor, batched: bool = False) -> dict[str, Tensor]:
    """∂L_i/∂θ for each loss: one backward per loss, or one vmapped backward with batched grad outputs."""
    names = list(losses)
    if batched:
        stacked = torch.stack([losses[name] for name in names])  # [L]
        eye = torch.eye(len(names), device=params.device)  # [L, L]
        (grads,) = torch.autograd.grad(stacked, params, eye, retain_graph=True, is_grads_batched=True)  # [L, P]
        return dict(zip(names, grads.unbind(0), strict=True))
    out = {}
    for name in names:
        (grad,) = torch.autograd.grad(losses[name], params, retain_graph=True, allow_unused=True)
        out[name] = torch.zeros_like(params) if grad is None else grad
    return out


def _commit(ok: Tensor, pairs: list[tuple[Tensor, Tensor]]) -> None:
    """dst ← where(ok, new, dst) for every pair: the guard's skip, on the device."""
    for dst, new in pairs:
        dst.copy_(torch.where(ok, new, dst))


def train_step(
    state: TrainState,
    batch: Batch,
    draws: Draws,
    hp: Hyper,
    flags: StepFlags = StepFlags(),
    timer: SectionTimer = NO_TIMER,
    batched_grads: bool = False,
) -> StepOutput:
    d = state.dims
    atoms = state.atoms  # [N]
    weight = batch.weight  # [B]
    reward = batch.reward * hp.reward_scale  # [B]
    losses: dict[str, Tensor] = {}
    budgeted: dict[str, Tensor] = {}
    t = state.updates + 1  # [] Adam's 1-based update count; first, so every group's update may fork from here

    with timer.section("forward_backward"):
        p = state.main.views(state.online)
        obs = batch.obs.detach().requires_grad_(flags.vaccine)  # [B, F]
        h_s2 = trunk(p, obs)  # [B, H]
        logits = c51_logits(p, h_s2, d)  # [B, K, A, N]
        q = expected_q(logits, atoms)  # [B, K, A]
        with torch.no_grad():
            # Double DQN: a* = argmax_a E[Z_online(s', a)], evaluated by the target network.
            a_star = double_dqn_action(c51_logits(p, trunk(p, batch.next_obs), d), atoms)  # [B, K]
            pt = state.main.views(state.target)
            h_target = trunk(pt, torch.cat([batch.obs, batch.next_obs]))  # [2B, H]
            h_target_obs, h_target_next = h_target.chunk(2)  # 2 × [B, H]
            next_logits = c51_logits(pt, h_target_next, d)  # [B, K, A, N]
            index = a_star[:, :, None, None].expand(-1, -1, 1, d.atoms)  # [B, K, 1, N]
            next_pmf = next_logits.gather(2, index).squeeze(2).softmax(-1)  # [B, K, N]
            target_pmf = categorical_projection(next_pmf, reward, batch.done, hp.gamma, atoms)  # [B, K, N]
        c51_per_sample = c51_cross_entropy(logits, batch.action, target_pmf)  # [B]
        losses["c51"] = (weight * c51_per_sample).mean()
        budgeted["c51"] = losses["c51"]
        if hp.cql:
            losses["cql"] = hp.cql_alpha * (weight * cql_penalty(q, batch.action)).mean()
            budgeted["cql"] = losses["cql"]

    if hp.iqn:
        with timer.section("iqn"):
            z = iqn_quantiles(p, h_s2, draws.tau, d)  # [B, T, K, A]
            z_data = z.gather(3, batch.action[:, None, :, None].expand(-1, z.shape[1], -1, 1)).squeeze(3)  # [B, T, K]
            with torch.no_grad():
                z_next = iqn_quantiles(pt, h_target_next, draws.tau_target, d)  # [B, T', K, A]
                z_next = z_next.gather(3, a_star[:, None, :, None].expand(-1, z_next.shape[1], -1, 1)).squeeze(3)
                z_target = iqn_target(z_next, reward, batch.done, hp.gamma)  # [B, T', K]
            iqn_per_sample = quantile_huber_loss(z_data, z_target, draws.tau, hp.kappa)  # [B]
            losses["iqn"] = (weight * iqn_per_sample).mean()
            budgeted["iqn"] = losses["iqn"]

    if hp.ensemble:
        with timer.section("ensemble"):
            heads = ensemble_logits(p, h_s2, d)  # [E, B, K, A, N]
            per_sample = ensemble_loss(heads, batch.action, target_pmf, atoms, hp.diversity)  # [B]
            losses["ensemble"] = (weight * per_sample).mean()
            budgeted["ensemble"] = losses["ensemble"]

    if flags.vaccine:
        with timer.section("vaccine"):
            # FGSM: s_adv = s + ε sign(∇_s L_c51); penalise KL(Z(s) ‖ Z(s_adv)) within the C51 budget.
            (grad_obs,) = torch.autograd.grad(losses["c51"], obs, retain_graph=True)  # [B, F]
            adv_logits = c51_logits(p, trunk(p, fgsm_states(obs.detach(), grad_obs, hp.vaccine_epsilon)), d)
            losses["vaccine"] = hp.vaccine_weight * (weight * distribution_shift_penalty(logits, adv_logits)).mean()
            budgeted["c51"] = losses["c51"] + losses["vaccine"]

    if flags.causal:
        with timer.section("causal"), torch.no_grad():
            # do(s_f := shuffled s_f) for each feature f; effect_f = mean |Q(do) − Q|.
            intervened = intervene(batch.obs, draws.perm)  # [F, B, F]
            q_do = expected_q(c51_logits(p, trunk(p, intervened.flatten(0, 1)), d), atoms)  # [F·B, K, A]
            state.causal_effects.copy_(intervention_effects(q.detach(), q_do.view(d.obs_dim, *q.shape)))

    with timer.section("forward_backward"):
        grads = per_loss_gradients(budgeted, state.online, batched=batched_grads)

    with timer.section("clip_prune"):
        grad = combine_budgeted(grads, hp.budgets) * state.prune_mask  # [Pm]

    with timer.section("adam"):
        candidate, m, v = adam_update(
            state.online.detach(), grad, state.adam_main, t, hp.lr, hp.beta1, hp.beta2, hp.eps
        )

    with timer.section("spectral"):
        u = state.spectral_u
        if hp.spectral_norm:
            candidate, u = spectral_project(candidate, state.spectral_u, state.main, hp.sigma_max)

    # IQL and attention read the pre-update trunk and target: their candidates are computed before the commit.
    updates: list[tuple[Tensor, Tensor]] = [
        (state.online, candidate),
        (state.adam_main.m, m),
        (state.adam_main.v, v),
        (state.spectral_u, u),
    ]
    checks = [grad, candidate, torch.stack([loss.detach() for loss in budgeted.values()])]
    if hp.iql:
        with timer.section("iql"):
            pq = state.iql.views(state.iql_params)
            value = iql_value(pq, h_s2.detach())  # [B]
            with torch.no_grad():
                q_target = expected_q(c51_logits(pt, h_target_obs, d), atoms)  # [B, K, A]
                q_target_data = q_target.gather(2, batch.action[:, :, None]).squeeze(2).mean(1)  # [B]
            losses["iql"] = (weight * expectile_loss(value, q_target_data, hp.expectile)).mean()
            (iql_grad,) = torch.autograd.grad(losses["iql"], state.iql_params)
            new, m_q, v_q = adam_update(
                state.iql_params.detach(), iql_grad, state.adam_iql, t, hp.aux_lr, hp.beta1, hp.beta2, hp.eps
            )
            updates += [(state.iql_params, new), (state.adam_iql.m, m_q), (state.adam_iql.v, v_q)]
            checks += [iql_grad, losses["iql"].detach()[None]]
    if hp.attention:
        with timer.section("attention"):
            pa = state.attn.views(state.attn_params)
            prediction = attention_predict(pa, batch.window, d)  # [B, F]
            losses["attention"] = (weight * next_state_loss(prediction, batch.next_obs)).mean()
            (attn_grad,) = torch.autograd.grad(losses["attention"], state.attn_params)
            new, m_a, v_a = adam_update(
                state.attn_params.detach(), attn_grad, state.adam_attn, t, hp.aux_lr, hp.beta1, hp.beta2, hp.eps
            )
            updates += [(state.attn_params, new), (state.adam_attn.m, m_a), (state.adam_attn.v, v_a)]
            checks += [attn_grad, losses["attention"].detach()[None]]

    with timer.section("guard"), torch.no_grad():
        # Any non-finite loss or gradient skips the whole update on the device: torch.where, no host branch.
        ok = torch.stack([torch.isfinite(tensor).all() for tensor in checks]).all()  # []
        _commit(ok, updates)
        state.updates.add_(ok.to(state.updates.dtype))
        state.guard_skips.add_((~ok).to(state.guard_skips.dtype))

    with timer.section("ema"), torch.no_grad():
        # target ← lerp(target, online, τ), only when the online update was applied.
        _commit(ok, [(state.target, ema(state.target, state.online, hp.target_tau))])

    per_sample = iqn_per_sample if hp.iqn else c51_per_sample
    priority = torch.nan_to_num(per_sample.detach(), nan=0.0, posinf=0.0, neginf=0.0)  # [B]
    return StepOutput(losses={k: v.detach() for k, v in losses.items()}, priority=priority, ok=ok)
