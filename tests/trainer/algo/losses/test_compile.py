"""Capture safety: every loss compiles to one graph and replays inside a CUDA graph.

torch.compile(fullgraph=True) fails on any graph break (`.item()`, a host branch on a tensor value).
On CPU (marked slow, ~15 s) the losses are traced with the `aot_eager` backend, forward and backward,
which finds graph breaks without Inductor's minutes of C++ compilation. The `gpu` tests compile them
with Inductor (Triton) and capture each one's forward and backward in a CUDA graph, replay it on new
inputs and compare with eager: what the graph and fused plans rely on.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from trainer.algo import losses

B, K, A, N, T, TT, F, E = 4, 3, 5, 11, 6, 7, 8, 2


Case = tuple[Callable[..., torch.Tensor], tuple[object, ...]]


def cases(gen: torch.Generator) -> dict[str, Case]:
    """Each loss with small float32 inputs of the documented shapes (on the CPU)."""
    support = torch.linspace(-5, 5, N)
    logits = torch.randn(B, K, A, N, generator=gen)
    action = torch.randint(0, A, (B, K), generator=gen)
    pmf = torch.softmax(torch.randn(B, K, N, generator=gen), -1)
    reward = torch.randn(B, generator=gen)
    done = (torch.rand(B, generator=gen) < 0.5).float()
    tau = torch.rand(B, T, generator=gen)
    obs = torch.randn(B, F, generator=gen)
    q = torch.randn(B, K, A, generator=gen)
    return {
        "categorical_projection": (losses.categorical_projection, (pmf, reward, done, 0.99, support)),
        "target_distribution": (losses.target_distribution, (logits, action, reward, done, 0.99, support)),
        "double_dqn_action": (losses.double_dqn_action, (logits, support)),
        "c51_cross_entropy": (losses.c51_cross_entropy, (logits, action, pmf)),
        "expected_q": (losses.expected_q, (logits, support)),
        "dueling_logits": (losses.dueling_logits, (torch.randn(B, 1, 1, N, generator=gen), logits)),
        "cql_penalty": (losses.cql_penalty, (q, action)),
        "cosine_features": (losses.cosine_features, (tau, 16)),
        "quantile_huber_loss": (
            losses.quantile_huber_loss,
            (torch.randn(B, T, K, generator=gen), torch.randn(B, TT, K, generator=gen), tau, 1.0),
        ),
        "iqn_target": (losses.iqn_target, (torch.randn(B, TT, K, generator=gen), reward, done, 0.99)),
        "expectile_loss": (losses.expectile_loss, (torch.randn(B, generator=gen), reward, 0.7)),
        "next_state_loss": (losses.next_state_loss, (obs, torch.randn(B, F, generator=gen))),
        "ensemble_loss": (
            losses.ensemble_loss,
            (torch.randn(E, B, K, A, N, generator=gen), action, pmf, support, 0.1),
        ),
        "fgsm_states": (losses.fgsm_states, (obs, torch.randn(B, F, generator=gen), 0.01)),
        "distribution_shift_penalty": (losses.distribution_shift_penalty, (logits, logits + 0.1)),
        "intervene": (losses.intervene, (obs, torch.randperm(B, generator=gen))),
        "intervention_effects": (losses.intervention_effects, (q, torch.randn(F, B, K, A, generator=gen))),
    }


def test_cases_cover_every_exported_loss(gen: torch.Generator) -> None:
    assert set(cases(gen)) == set(losses.__all__)


def check_compiled_matches_eager(gen: torch.Generator, device: str, backend: str) -> None:
    """All losses in one function compiled with fullgraph=True: outputs and input gradients match eager.

    One function keeps this to one forward and one backward graph, so one compilation.
    """
    torch._dynamo.reset()
    named = cases(gen)
    names = sorted(named)
    functions = [named[name][0] for name in names]
    args = [on(device, named[name][1], requires_grad=True) for name in names]

    def every_loss(all_args: list[tuple[object, ...]]) -> list[torch.Tensor]:
        return [fn(*fn_args) for fn, fn_args in zip(functions, all_args, strict=True)]

    def outputs_and_grads(run: Callable[..., list[torch.Tensor]]) -> list[torch.Tensor]:
        outs = run(args)
        total = sum(out.sum() for out in outs if out.requires_grad)
        inputs = [a for fn_args in args for a in fn_args if isinstance(a, torch.Tensor) and a.requires_grad]
        return [*outs, *torch.autograd.grad(total, inputs, allow_unused=True, materialize_grads=True)]

    compiled = torch.compile(every_loss, fullgraph=True, dynamic=False, backend=backend)
    for got, want in zip(outputs_and_grads(compiled), outputs_and_grads(every_loss), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_traces_to_one_graph_forward_and_backward(gen: torch.Generator) -> None:
    check_compiled_matches_eager(gen, "cpu", "aot_eager")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_inductor_on_cuda_matches_eager(gen: torch.Generator) -> None:
    check_compiled_matches_eager(gen, "cuda", "inductor")


def on(device: str, args: tuple[object, ...], requires_grad: bool = False) -> tuple[object, ...]:
    """`args` with every tensor copied to `device`; float tensors optionally requiring grad."""
    moved = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    if requires_grad:
        moved = [a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in moved]
    return tuple(moved)


def forward_backward(fn: Callable[..., torch.Tensor], args: tuple[object, ...]) -> list[torch.Tensor]:
    """The output and, if it is differentiable, the gradient of its sum w.r.t. every float input."""
    out = fn(*args)
    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if not out.requires_grad:
        return [out]
    grads = torch.autograd.grad(out.sum(), inputs, allow_unused=True, materialize_grads=True)
    return [out, *grads]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", sorted(losses.__all__))
def test_replays_in_a_cuda_graph_and_agrees_with_eager(gen: torch.Generator, name: str) -> None:
    fn, cpu_args = cases(gen)[name]
    static = on("cuda", cpu_args, requires_grad=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as capture requires
        forward_backward(fn, static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = forward_backward(fn, static)
    # new inputs of the same shapes, written into the captured buffers, then one replay
    fresh = on("cuda", cases(torch.Generator().manual_seed(99))[name][1], requires_grad=True)
    with torch.no_grad():
        for buffer, value in zip(static, fresh, strict=True):
            if isinstance(buffer, torch.Tensor):
                buffer.copy_(value)
    graph.replay()
    expected = forward_backward(fn, fresh)
    for got, want in zip(captured, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
