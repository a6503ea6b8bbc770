import torch

from trainer.algo.losses._select import take


def test_take_is_gather_bit_for_bit_with_the_same_gradient() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 3, 5, 11, generator=generator, dtype=torch.float64).float().requires_grad_(True)
    action = torch.randint(0, 5, (6, 3), generator=generator)
    index = action[:, :, None, None]  # [B, K, 1, 1]
    got = take(logits, index, dim=2)  # [B, K, N]
    want = logits.gather(2, index.expand(-1, -1, 1, 11)).squeeze(2)
    assert torch.equal(got, want)
    upstream = torch.randn(got.shape, generator=generator)
    (grad_take,) = torch.autograd.grad(got, logits, upstream)
    (grad_gather,) = torch.autograd.grad(want, logits, upstream)
    assert torch.equal(grad_take, grad_gather)


def test_take_on_the_last_dimension_ignores_non_finite_unselected_entries() -> None:
    q = torch.tensor([[1.5, float("nan"), float("inf")], [float("-inf"), -2.0, 3.0]])
    assert torch.equal(take(q, torch.tensor([[0], [1]]), dim=-1), torch.tensor([1.5, -2.0]))
