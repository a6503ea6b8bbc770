"""Ways to write two of the step's small batched ops, timed compiled on the GPU, to choose one by measurement.

The bench model's attention runs 4096 problems of 16 × 16 × 32 (B × heads windows of W = 16, head size 32),
and the C51 projection 1024 products of [K, N] × [N, N] (N = 51): far below the tiles that cuDNN's flash
attention and cuBLAS/CUTLASS launch, so their kernels run mostly empty. Each variant here computes the
same values (checked against the first); for each the forward + backward (attention, bf16) or the
forward (projection) is compiled with Inductor and profiled, and its GPU kernel time per call is
printed (the plans run the step as CUDA graphs, so launch time does not count). Measured before (H200,
2026-12-04): attention as `q @ kᵀ` and softmax is pattern-matched back to SDPA (the same kernels), and
as broadcast products and sums it took 263 µs against SDPA's 195.

    python scripts/bench_small_ops.py [--calls 50]
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Callable

import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from trainer.kernels.window_attention import window_attention_fused
from trainer.losses.c51 import categorical_projection
from trainer.model import self_attention


def bmm_projection(next_pmf: Tensor, weight: Tensor) -> Tensor:
    return torch.bmm(next_pmf, weight)  # [B, K, N]


def kernel_ms(fn_call: Callable[[], object], calls: int) -> tuple[float, int, list[str]]:
    """GPU kernel time per call (ms), kernels per call, and the kernels' names."""
    for _ in range(3):
        fn_call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn_call()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    names = collections.Counter(e.name[:90] for e in kernels)
    return sum(e.device_time for e in kernels) / 1e3 / calls, len(kernels) // calls, sorted(names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--branches", type=int, default=4)
    parser.add_argument("--atoms", type=int, default=51)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    generator = torch.Generator(device).manual_seed(0)
    rows = []

    qkv = torch.randn(args.batch, 16, 3, 4, 32, device=device, generator=generator)  # [B, W, 3, h, d]
    want = self_attention(qkv)
    for name, attend in [("self_attention (SDPA)", self_attention), ("window_attention_fused", window_attention_fused)]:
        torch.testing.assert_close(attend(qkv), want, rtol=1e-4, atol=1e-4)  # float32
        leaf = qkv.to(torch.bfloat16).requires_grad_()
        with torch.no_grad():
            torch.testing.assert_close(attend(leaf).float(), want, rtol=2e-2, atol=2e-2)
        compiled = torch.compile(lambda x, f=attend: f(x).float().square().sum())

        def step(compiled=compiled, leaf=leaf) -> None:
            loss = compiled(leaf)
            loss.backward()
            leaf.grad = None

        rows.append((f"attention fwd+bwd bf16: {name}", *kernel_ms(step, args.calls)))

    pmf = torch.rand(args.batch, args.branches, args.atoms, device=device, generator=generator).softmax(-1)
    reward = torch.randn(args.batch, device=device, generator=generator)
    done = (torch.rand(args.batch, device=device, generator=generator) < 0.1).float()
    atoms = torch.linspace(-10, 10, args.atoms, device=device)
    want = categorical_projection(pmf, reward, done, 0.99, atoms)
    compiled_projection = torch.compile(categorical_projection)
    torch.testing.assert_close(compiled_projection(pmf, reward, done, 0.99, atoms), want)
    project = lambda: compiled_projection(pmf, reward, done, 0.99, atoms)  # noqa: E731
    rows.append(("projection fwd fp32: categorical_projection", *kernel_ms(project, args.calls)))
    weight = torch.rand(args.batch, args.atoms, args.atoms, device=device, generator=generator)
    compiled_bmm = torch.compile(bmm_projection)
    rows.append(("projection bmm alone (TF32)", *kernel_ms(lambda: compiled_bmm(pmf, weight), args.calls)))

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.calls} calls")
    for name, ms, count, names in rows:
        print(f"\n{name}: {ms * 1e3:.1f} us, {count} kernels\n    " + "\n    ".join(names))
    print("\nvariant                                          us/call  kernels")
    for name, ms, count, _ in rows:
        print(f"{name:48s} {ms * 1e3:7.1f}  {count:7d}")


if __name__ == "__main__":
    main()
