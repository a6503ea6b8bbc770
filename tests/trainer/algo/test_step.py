import contextlib
from collections.abc import Iterator
from dataclasses import fields

import pytest
import torch
from torch import Tensor

from contracts.config import build_config
from tests.factories import random_batch, tiny_config, tiny_state
from trainer.algo.losses.c51 import categorical_projection, double_dqn_action, expected_q, target_distribution
from trainer.algo.losses.iqn import iqn_target
from trainer.algo.model import PADDED, ParamLayout, c51_logits, iqn_quantiles, self_attention, trunk
from trainer.algo.step import (
    Draws,
    Hyper,
    StepFlags,
    budget_names,
    compute_targets,
    head_losses,
    iqn_loss,
    mixed_precision,
    per_loss_gradients,
    train_step,
)
from trainer.execution.plans.fused import BF16_RTOL


def test_hyper_copies_same_named_loss_and_optim_fields_and_derives_the_rest() -> None:
    config = build_config(
        {
            "model": {"ensemble_heads": 2},
            "loss": {"gamma": 0.9, "iqn_kappa": 2.0, "iql_expectile": 0.8, "ensemble_diversity": 0.3},
            "optim": {"lr": 3e-3, "max_grad_norm": 2.0, "budget_c51": 0.5, "spectral_norm": False},
            "run": {"precision": "bf16"},
        }
    )
    hp = Hyper.from_config(config)
    loss, optim = config.loss.model_dump(), config.optim.model_dump()
    assert not set(loss) & set(optim)  # a same-named field has one source
    derived = {
        "kappa",
        "expectile",
        "diversity",
        "ensemble",
        "budgets",
        "autocast",
        "attend",
        "c51_target",
        "iqn_target",
        "iqn_online",
        "target_networks",
    }
    copied = [f.name for f in fields(Hyper) if f.name not in derived]
    assert all(getattr(hp, name) == {**loss, **optim}[name] for name in copied)
    assert (hp.gamma, hp.lr, hp.spectral_norm) == (0.9, 3e-3, False)
    assert (hp.kappa, hp.expectile, hp.diversity, hp.ensemble) == (2.0, 0.8, 0.3, True)
    assert hp.budgets["c51"] == 0.5 * 2.0 and hp.autocast is torch.bfloat16
    assert hp.attend is self_attention  # the maths; only the fused plans swap in their kernels
    assert hp.c51_target is target_distribution and hp.iqn_target is None and hp.iqn_online is None  # as written
    assert hp.target_networks is None


def _draws(state, batch_size: int, seed: int = 0) -> Draws:
    return Draws.empty(state.dims, batch_size, torch.device("cpu")).fill_(torch.Generator().manual_seed(seed))


def _snapshot(state) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in state.tensors().items()}


def test_a_step_updates_every_network_and_reports_every_loss() -> None:
    config = tiny_config()
    state = tiny_state(config)
    before = _snapshot(state)
    batch = random_batch(state, 16)
    flags = StepFlags(vaccine=True, causal=True)
    output = train_step(state, batch, _draws(state, 16), Hyper.from_config(config), flags)
    assert bool(output.ok)
    assert set(output.losses) == {"c51", "cql", "iqn", "ensemble", "vaccine", "iql", "attention"}
    assert all(torch.isfinite(value) for value in output.losses.values())
    for name in ("online", "target", "iql", "attn", "adam_main.m", "adam_iql.m", "adam_attn.m", "causal_effects"):
        assert not torch.equal(before[name], state.tensors()[name]), name
    assert state.updates.item() == 1 and state.guard_skips.item() == 0
    assert output.priority.shape == (16,) and torch.all(output.priority >= 0)


def test_guard_skips_a_poisoned_batch_and_leaves_every_parameter_unchanged() -> None:
    config = tiny_config()
    state = tiny_state(config)
    hp = Hyper.from_config(config)
    train_step(state, random_batch(state, 16, seed=1), _draws(state, 16), hp)  # moments non-zero
    before = _snapshot(state)
    batch = random_batch(state, 16, seed=2)
    batch.reward[3] = float("nan")
    output = train_step(state, batch, _draws(state, 16), hp, StepFlags(vaccine=True))
    assert not bool(output.ok)
    after = state.tensors()
    for name, tensor in before.items():
        if name != "guard_skips":
            assert torch.equal(tensor, after[name]), name
    assert after["guard_skips"].item() == 1
    assert torch.isfinite(output.priority).all()
    # and the next clean step trains again
    assert bool(train_step(state, random_batch(state, 16, seed=3), _draws(state, 16), hp).ok)


def test_pruned_weights_stay_zero_through_training() -> None:
    config = tiny_config(optim={"prune_sparsity": 0.5})
    state = tiny_state(config)
    pruned = state.prune_mask == 0
    assert pruned.any()
    hp = Hyper.from_config(config)
    for seed in range(5):
        train_step(state, random_batch(state, 16, seed), _draws(state, 16, seed), hp, StepFlags(vaccine=True))
    assert torch.all(state.online.detach()[pruned] == 0)
    assert torch.all(state.target[pruned] == 0)


def _unused(layout: ParamLayout) -> Tensor:
    """[P] bool: the flat elements no parameter's own view reads (alignment gaps, padded rows)."""
    marks = torch.ones(layout.size)
    for name, view in layout.views(marks).items():
        if name not in layout.groups and not name.endswith(PADDED):
            view.zero_()
    return marks.bool()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_alignment_gaps_and_padded_rows_stay_zero_with_zero_adam_moments(precision: str) -> None:
    """The padded outputs are sliced away, so their rows get no gradient: parameters, target and both Adam
    moments stay exactly zero there through steps of every kind (vaccine, causal, ensemble, bf16)."""
    config = tiny_config([f"run.precision={precision}"])
    state = tiny_state(config)
    hp = Hyper.from_config(config)
    for step in range(4):
        flags = StepFlags(vaccine=step % 2 == 0, causal=step == 1)
        assert bool(train_step(state, random_batch(state, 16, step), _draws(state, 16, step), hp, flags).ok)
    groups = [
        (state.main, [state.online, state.target, state.adam_main.m, state.adam_main.v]),
        (state.iql, [state.iql_params, state.adam_iql.m, state.adam_iql.v]),
        (state.attn, [state.attn_params, state.adam_attn.m, state.adam_attn.v]),
    ]
    for layout, tensors in groups:
        unused = _unused(layout)
        assert unused.any()  # the tiny widths do leave pads
        for tensor in tensors:
            assert tensor.detach()[unused].eq(0).all()
        assert state.adam_main.v[~_unused(state.main)].gt(0).any()  # and the rest did train


def test_spectral_norm_bounds_every_matrix_after_steps() -> None:
    config = tiny_config(optim={"sigma_max": 0.8, "lr": 0.05})
    state = tiny_state(config)
    hp = Hyper.from_config(config)
    for seed in range(40):
        train_step(state, random_batch(state, 16, seed), _draws(state, 16, seed), hp)
    views = state.main.views(state.online.detach())
    for spec in state.main.matrices():
        assert torch.linalg.matrix_norm(views[spec.name], ord=2) <= 0.8 * 1.05, spec.name


def test_per_loss_gradients_are_each_budgeted_losses_own_gradient() -> None:
    """The batched Jacobian (heads) and IQN's own backward give what one autograd backward per loss gives."""
    config = tiny_config()
    state = tiny_state(config)
    hp = Hyper.from_config(config)
    batch, draws, flags = random_batch(state, 16), _draws(state, 16), StepFlags(vaccine=True)
    targets = compute_targets(state, batch, draws, hp)
    grads, forward = per_loss_gradients(state, batch, draws, hp, flags, targets)
    assert budget_names(hp) == ["c51", "cql", "iqn", "ensemble"] and set(grads) == set(budget_names(hp))
    online = state.online.clone().requires_grad_(True)
    heads, _ = head_losses(online, state, batch, flags, hp, targets)  # c51 (+ vaccine), cql, ensemble
    iqn, _ = iqn_loss(online, state, batch, draws, hp, targets)
    for name, loss in zip(["c51", "cql", "ensemble", "iqn"], [*heads.unbind(0), iqn], strict=True):
        (expected,) = torch.autograd.grad(loss, online, retain_graph=True)
        assert torch.allclose(grads[name], expected, rtol=1e-5, atol=1e-7), name
        assert expected.abs().sum() > 0, name
    # budgeted losses in budget order; the C51 entry carries the vaccine penalty (same budget)
    assert torch.allclose(forward.budgeted[0], forward.losses["c51"] + forward.losses["vaccine"])
    assert torch.allclose(forward.budgeted[2], forward.losses["iqn"])


def test_target_network_gets_no_gradient_and_only_moves_by_ema() -> None:
    config = tiny_config(optim={"target_tau": 0.5})
    state = tiny_state(config)
    target_before = state.target.clone()
    train_step(state, random_batch(state, 16), _draws(state, 16), Hyper.from_config(config))
    expected = torch.lerp(target_before, state.online.detach(), 0.5)
    assert torch.allclose(state.target, expected, atol=1e-6)


@pytest.mark.parametrize("step, vaccine, causal", [(0, True, True), (10, True, False), (7, False, False)])
def test_periodic_flags(step: int, vaccine: bool, causal: bool) -> None:
    config = tiny_config()
    assert StepFlags.for_step(step, config) == StepFlags(vaccine=vaccine, causal=causal)
    off = tiny_config(loss={"vaccine": False, "causal": False})
    assert StepFlags.for_step(step, off) == StepFlags()


def test_disabled_components_produce_no_loss() -> None:
    config = tiny_config(
        loss={"cql": False, "iqn": False, "iql": False, "attention": False, "vaccine": False, "causal": False},
        model={"ensemble_heads": 0},
    )
    state = tiny_state(config)
    attn_before = state.attn_params.detach().clone()
    output = train_step(state, random_batch(state, 16), _draws(state, 16), Hyper.from_config(config))
    assert set(output.losses) == {"c51"}
    assert torch.equal(attn_before, state.attn_params.detach())


class _FlatSections:
    """A SectionTimer that fails on a section opened inside another: nested ones would be counted twice."""

    def __init__(self) -> None:
        self.open: str | None = None
        self.names: list[str] = []

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        assert self.open is None, f"section {name!r} opened inside {self.open!r}"
        self.open = name
        self.names.append(name)
        try:
            yield
        finally:
            self.open = None


def test_step_sections_do_not_nest_so_components_add_up_to_the_step() -> None:
    config = tiny_config()
    state = tiny_state(config)
    timer = _FlatSections()
    flags = StepFlags(vaccine=True, causal=True)
    train_step(state, random_batch(state, 16), _draws(state, 16), Hyper.from_config(config), flags, timer)
    assert set(timer.names) == {
        "forward_backward",
        "iqn",
        "causal",
        "iql",
        "attention",
        "clip_prune",
        "adam",
        "spectral",
        "guard",
        "ema",
    }


def _relative_errors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict[str, float]:
    return {
        name: float((got[name].double() - tensor.double()).norm() / tensor.double().norm().clamp(min=1e-12))
        for name, tensor in want.items()
    }


def test_bf16_precision_autocasts_the_networks_and_keeps_their_outputs_float32() -> None:
    config = tiny_config(["run.precision=bf16"])
    hp = Hyper.from_config(config)
    assert hp.autocast is torch.bfloat16 and Hyper.from_config(tiny_config()).autocast is None
    state = tiny_state(config)
    p, batch = state.main.views(state.online), random_batch(state, 16)
    with mixed_precision(hp, torch.device("cpu")):
        h_s2 = trunk(p, batch.obs)  # [B, H]
        logits = c51_logits(p, h_s2, state.dims)  # [B, K, A, N]
    assert h_s2.dtype == torch.bfloat16  # the matrix products ran in bf16
    assert logits.dtype == torch.float32  # what the losses read is float32


def test_a_bf16_step_stays_within_the_stated_tolerance_of_float32() -> None:
    """Five steps (vaccine and causal included) in bf16 and in float32 from one state and batch sequence:
    every state tensor within BF16_RTOL, parameters, Adam moments and spectral vectors float32."""
    config = tiny_config()
    fp32, bf16 = tiny_state(config), tiny_state(config)
    hp = Hyper.from_config(config)
    hp_bf16 = Hyper.from_config(tiny_config(["run.precision=bf16"]))
    for step in range(5):
        batch, draws, flags = random_batch(fp32, 16, step), _draws(fp32, 16, step), StepFlags.for_step(step, config)
        want = train_step(fp32, batch, draws, hp, flags)
        got = train_step(bf16, batch, draws, hp_bf16, flags)
        assert bool(got.ok) and set(got.losses) == set(want.losses)
        assert all(value.dtype == torch.float32 for value in got.losses.values())
    assert all(tensor.dtype in (torch.float32, torch.int64) for tensor in bf16.tensors().values())
    errors = _relative_errors(bf16.tensors(), fp32.tensors())
    assert {name: e for name, e in errors.items() if not e <= BF16_RTOL} == {}
    assert errors["online"] > 0  # bf16 did change the arithmetic


def test_draws_without_permutation_keep_the_random_stream() -> None:
    """permute=False (causal off) leaves the sort out, and every other draw is the one permute=True gives."""
    state = tiny_state(tiny_config())
    sorted_draws = Draws.empty(state.dims, 16, torch.device("cpu")).fill_(torch.Generator().manual_seed(3))
    plain = Draws.empty(state.dims, 16, torch.device("cpu"), permute=False).fill_(torch.Generator().manual_seed(3))
    assert torch.equal(plain.tau, sorted_draws.tau) and torch.equal(plain.tau_target, sorted_draws.tau_target)
    assert torch.equal(plain.perm, torch.arange(16))
    assert sorted(sorted_draws.perm.tolist()) == list(range(16)) and not torch.equal(sorted_draws.perm, plain.perm)


def test_targets_of_the_stacked_networks_are_each_networks_own_passes() -> None:
    """`compute_targets` runs the online and target networks as one stacked pass over (s, s'): it must
    give what each network's own forward gives (online picks a*, target evaluates it), in float32."""
    config = tiny_config()
    state = tiny_state(config)
    with torch.no_grad():  # a target network apart from the online one, so a swap of the two would show
        state.target.add_(0.05 * torch.randn(state.target.shape, generator=torch.Generator().manual_seed(7)))
    hp, batch = Hyper.from_config(config), random_batch(state, 16)
    draws = _draws(state, 16)
    assert hp.iql and hp.iqn
    got = compute_targets(state, batch, draws, hp)

    d, atoms = state.dims, state.atoms
    p, pt = state.main.views(state.online), state.main.views(state.target)
    a_star = double_dqn_action(c51_logits(p, trunk(p, batch.next_obs), d), atoms)  # [B, K]
    h_next = trunk(pt, batch.next_obs)  # [B, H]
    next_logits = c51_logits(pt, h_next, d)  # [B, K, A, N]
    index = a_star[:, :, None, None].expand(-1, -1, 1, d.atoms)
    reward = batch.reward * hp.reward_scale
    next_pmf = next_logits.gather(2, index).squeeze(2).softmax(-1)  # [B, K, N]
    target_pmf = categorical_projection(next_pmf, reward, batch.done, hp.gamma, atoms)
    q_target_obs = expected_q(c51_logits(pt, trunk(pt, batch.obs), d), atoms)  # [B, K, A]
    z_next = iqn_quantiles(pt, h_next, draws.tau_target, d)  # [B, T', K, A]
    z_next = z_next.gather(3, a_star[:, None, :, None].expand(-1, z_next.shape[1], -1, 1)).squeeze(3)
    z_target = iqn_target(z_next, reward, batch.done, hp.gamma)  # [B, T', K]
    for name, want in (("target_pmf", target_pmf), ("q_target_obs", q_target_obs), ("z_target", z_target)):
        torch.testing.assert_close(
            getattr(got, name), want, rtol=1e-5, atol=1e-6, msg=lambda text, n=name: f"{n}: {text}"
        )
