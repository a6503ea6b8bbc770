"""The Triton quantile Huber kernel against the reference maths (trainer/losses/iqn.py): loss, gradient,
torch.func and torch.compile around it, and a whole training step. On the CPU through Triton's interpreter."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.factories import random_batch, tiny_config, tiny_state
from trainer.kernels.quantile_huber import quantile_huber_loss_fused
from trainer.losses.iqn import quantile_huber_loss
from trainer.step import Draws, Hyper, StepFlags, train_step

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(shape: tuple[int, int, int, int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantiles [B, T, K], target quantiles [B, T', K] and taus [B, T] for shape (B, T, T', K)."""
    b, t, t_target, k = shape
    generator = torch.Generator().manual_seed(seed)
    quantiles = torch.randn(b, t, k, generator=generator)
    target = 2 * torch.randn(b, t_target, k, generator=generator)  # wide enough that |u| crosses kappa both ways
    tau = torch.rand(b, t, generator=generator)
    return quantiles.to(DEVICE), target.to(DEVICE), tau.to(DEVICE)


def _loss_and_grad(loss_fn, quantiles, target, tau, kappa, weight):  # type: ignore[no-untyped-def]
    def weighted_mean(q: torch.Tensor) -> torch.Tensor:
        return (weight * loss_fn(q, target, tau, kappa)).mean()

    return torch.func.grad_and_value(weighted_mean)(quantiles)


@pytest.mark.parametrize(
    "shape",
    [(8, 5, 7, 3), (3, 1, 32, 1), (4, 32, 32, 3), (2, 33, 17, 2)],
    ids=["odd", "one-tau", "pinned-taus", "past-a-power-of-two"],
)
@pytest.mark.parametrize("kappa", [0.5, 1.0, 3.0])
def test_loss_and_gradient_match_the_reference(shape: tuple[int, int, int, int], kappa: float) -> None:
    quantiles, target, tau = _inputs(shape)
    weight = torch.rand(shape[0], generator=torch.Generator().manual_seed(1)).to(DEVICE)
    want_grad, want_loss = _loss_and_grad(quantile_huber_loss, quantiles, target, tau, kappa, weight)
    got_grad, got_loss = _loss_and_grad(quantile_huber_loss_fused, quantiles, target, tau, kappa, weight)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-8)
    per_sample = quantile_huber_loss_fused(quantiles, target, tau, kappa)
    torch.testing.assert_close(per_sample, quantile_huber_loss(quantiles, target, tau, kappa), rtol=1e-5, atol=1e-7)


def test_gradient_at_the_huber_knee_and_at_zero_matches_autograd() -> None:
    """u exactly 0 and ±kappa: the kernel's clamp must pick the same one-sided derivative as autograd."""
    kappa = 1.0
    quantiles = torch.zeros(1, 3, 1, device=DEVICE)
    target = torch.tensor([[[-1.0], [0.0], [1.0]]], device=DEVICE)  # u ∈ {-kappa, 0, +kappa} for every quantile
    tau = torch.tensor([[0.1, 0.5, 0.9]], device=DEVICE)
    weight = torch.ones(1, device=DEVICE)
    want = _loss_and_grad(quantile_huber_loss, quantiles, target, tau, kappa, weight)
    got = _loss_and_grad(quantile_huber_loss_fused, quantiles, target, tau, kappa, weight)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)


def test_gradients_reach_only_the_online_quantiles() -> None:
    quantiles, target, tau = _inputs((4, 6, 5, 2))
    quantiles.requires_grad_(True)
    target.requires_grad_(True)
    quantile_huber_loss_fused(quantiles, target, tau, 1.0).sum().backward()
    assert quantiles.grad is not None and bool(quantiles.grad.abs().sum() > 0)
    assert target.grad is None


def test_compiled_in_one_graph_it_matches_the_reference() -> None:
    """fullgraph=True: Dynamo keeps the step one graph around the kernel (the fused plan's requirement)."""
    quantiles, target, tau = _inputs((6, 8, 8, 3))
    weight = torch.rand(6, generator=torch.Generator().manual_seed(2)).to(DEVICE)

    def step(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _loss_and_grad(quantile_huber_loss_fused, q, target, tau, 1.0, weight)

    torch._dynamo.reset()
    got_grad, got_loss = torch.compile(step, fullgraph=True)(quantiles)
    want_grad, want_loss = _loss_and_grad(quantile_huber_loss, quantiles, target, tau, 1.0, weight)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-8)


def test_a_training_step_with_the_kernel_matches_the_reference_step() -> None:
    """The step's Hyper.quantile_huber swapped for the kernel (what run.iqn_loss_kernel=triton does in the
    fused plans): three updates, vaccine and causal on, land on the same state."""
    config = tiny_config()
    reference, fused = tiny_state(config), tiny_state(config)
    hp = Hyper.from_config(config)
    hp_kernel = dataclasses.replace(hp, quantile_huber=quantile_huber_loss_fused)
    for step in range(3):
        batch = random_batch(reference, 16, seed=step)
        draws = Draws.empty(reference.dims, 16, torch.device("cpu")).fill_(torch.Generator().manual_seed(step))
        flags = StepFlags(vaccine=True, causal=step == 2)
        want = train_step(reference, batch, draws, hp, flags)
        got = train_step(fused, batch, draws, hp_kernel, flags)
        torch.testing.assert_close(got.losses, want.losses, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.priority, want.priority, rtol=1e-5, atol=1e-6)
    for name, tensor in reference.tensors().items():
        torch.testing.assert_close(fused.tensors()[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


def test_bad_shapes_and_kappa_are_rejected_with_the_reference_messages() -> None:
    quantiles, target, tau = _inputs((4, 6, 5, 2))
    with pytest.raises(ValueError, match="target_quantiles"):
        quantile_huber_loss_fused(quantiles, target[:, :, :1], tau, 1.0)
    with pytest.raises(ValueError, match="kappa must be positive"):
        quantile_huber_loss_fused(quantiles, target, tau, 0.0)
