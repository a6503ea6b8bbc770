"""Counter-based random numbers for the step-time draws (`run.rng: keyed`): a pack draws all runs' in one launch.

torch's generators carry hidden state, so a pack of K runs, each bound to draw exactly its solo run's numbers, makes
K launches of every draw: 112 a market pack step at K = 16 (issue 31, packs round 12). Here a draw is a pure
function of (the generator's key, its counter, the element's index), as JAX's keys are, and the counter advances by
one per draw. K runs' keys and counters stacked (`KeyedRows`) are K rows of one computation: on a GPU one Triton
kernel (`trainer.execution.kernels.keyed`), elsewhere the same integer arithmetic as torch ops, word for word.

The hash is PCG's output permutation (Jarzynski & Olano, "Hash Functions for GPU Rendering", JCGT 2020) over
32-bit words held in int64 (every product stays below 2^63, so the words are exact on every backend):
    h = pcg(key ^ pcg(counter)),  g = pcg(h ^ 0x9E3779B9),  word(i) = pcg((pcg(i ^ h) + g) mod 2^32)
Element e takes words e·W … e·W + W - 1. From them: a float32 uniform is its top 24 bits / 2^24, a float64 one 53 bits
of two words / 2^53 (both in [0, 1)); a normal is Box–Muller on two uniforms, sqrt(-2 ln(1 - u1)) cos(2π u2); an
integer in [0, high) is (word · high) >> 32.

A `KeyedGenerator` is a `torch.Generator` too (seeded alike), so what draws from it through torch (initialisation)
works unchanged; the draws of training and of the torch market's evaluation episodes go through `uniform_`,
`normal_` and `randint_` here, which take either kind. Under `run.rng: torch` (the default) those are torch's own
calls, the same numbers as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

MASK = 0xFFFFFFFF
GOLDEN = 0x9E3779B9
UNIFORM, NORMAL, RANDINT = "uniform", "normal", "randint"
STREAMS = {"step": 0, "explore": 1, "market": 2}
"""The streams of one run's seed: the replay's and the step's draws, ε-greedy's, the torch market's noise."""


def pcg(v: Tensor) -> Tensor:
    """PCG's hash of each 32-bit word (int64 in [0, 2^32))."""
    state = (v * 747796405 + 2891336453) & MASK
    word = ((torch.bitwise_right_shift(state, (state >> 28) + 4) ^ state) * 277803737) & MASK
    return (word >> 22) ^ word


def key_of(seed: int, stream: str) -> int:
    """The key of `stream` of `seed` (any int64): its two 32-bit halves, the stream's number added to the high one."""
    low, high = torch.tensor(seed & MASK), torch.tensor(((seed >> 32) & MASK) + STREAMS[stream])
    return int(pcg(pcg(low) ^ pcg(high)))


def words_per_element(kind: str, dtype: torch.dtype) -> int:
    wide = dtype == torch.float64
    return {UNIFORM: 2 if wide else 1, NORMAL: 4 if wide else 2, RANDINT: 1}[kind]


def keyed_values(keys: Tensor, counters: Tensor, count: int, kind: str, dtype: torch.dtype, high: int = 0) -> Tensor:
    """`count` values of each row's draw (keys, counters [R] int64) in `dtype`, as torch ops: [R, count]."""
    width = words_per_element(kind, dtype)
    h = pcg(keys ^ pcg(counters & MASK))  # [R]
    g = pcg(h ^ GOLDEN)
    index = torch.arange(count * width, device=keys.device, dtype=torch.int64)
    words = pcg((pcg(index[None, :] ^ h[:, None]) + g[:, None]) & MASK).view(-1, count, width)  # [R, count, W]
    if kind == RANDINT:
        return (words[..., 0] * high) >> 32
    if dtype == torch.float64:
        u = ((words[..., 0::2] >> 11) << 32 | words[..., 1::2]).double() * 2.0**-53  # [R, count, W / 2]
    else:
        u = (words >> 8).float() * 2.0**-24  # [R, count, W]
    if kind == UNIFORM:
        return u[..., 0]
    return torch.sqrt(-2.0 * torch.log(1.0 - u[..., 0])) * torch.cos(2.0 * torch.pi * u[..., 1])


def keyed_draw_(out: Tensor, keys: Tensor, counters: Tensor, rows: Tensor, kind: str, high: int = 0) -> Tensor:
    """Fill `out` [L, ...] (contiguous) with run rows[l]'s draw in row l, then advance those runs' counters."""
    if out.is_cuda:
        from trainer.execution.kernels.keyed import keyed_draw_kernel_  # Triton: what CUDA builds of torch bring

        return keyed_draw_kernel_(out, keys, counters, rows, kind, high)
    return keyed_draw_ops_(out, keys, counters, rows, kind, high)


def keyed_draw_ops_(out: Tensor, keys: Tensor, counters: Tensor, rows: Tensor, kind: str, high: int = 0) -> Tensor:
    """`keyed_draw_` as torch ops on any device (the CPU's form; on a GPU, the kernel's reference)."""
    flat = out.view(out.shape[0], -1)
    flat.copy_(keyed_values(keys[rows], counters[rows], flat.shape[1], kind, out.dtype, high))
    counters.index_add_(0, rows, torch.ones_like(rows))
    return out


class KeyedGenerator(torch.Generator):
    """A run's keyed stream: `key` and `counter` (one int64 each on its device, or a pack's row of them,
    `KeyedRows`); its torch generator state is seeded with `seed` for the draws torch makes from it."""

    key: Tensor
    counter: Tensor
    rows: KeyedRows | None

    def __new__(cls, seed: int, stream: str, device: torch.device | str = "cpu") -> KeyedGenerator:
        return super().__new__(cls, device)  # type: ignore[call-arg]  # torch.Generator(device)

    def __init__(self, seed: int, stream: str, device: torch.device | str = "cpu") -> None:
        self.stream = stream
        self.key = torch.zeros(1, dtype=torch.int64, device=device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        self.rows = None  # the pack's rows it draws as, once it is one run of many
        self._first = torch.zeros(1, dtype=torch.int64, device=device)  # the run's row in its own key/counter
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> KeyedGenerator:  # type: ignore[override]
        """Start the stream afresh from `seed` (in place: a pack's rows and a captured graph hold the tensors)."""
        super().manual_seed(seed)
        self.key.fill_(key_of(seed, self.stream))
        self.counter.zero_()
        return self

    def draw_(self, out: Tensor, kind: str, high: int = 0) -> Tensor:
        return keyed_draw_(out.view(1, -1), self.key, self.counter, self._first, kind, high).view(out.shape)

    def get_state(self) -> Tensor:
        """torch's state, then the counter's 8 bytes: what a checkpoint and a capture's warm-up undo keep."""
        counter = self.counter.cpu().view(torch.uint8)
        return torch.cat([super().get_state(), counter])

    def set_state(self, new_state: Tensor) -> KeyedGenerator:
        if new_state.numel() != super().get_state().numel() + 8:  # e.g. a checkpoint of a run under `run.rng: torch`
            raise ValueError(f"not a keyed generator's state ({new_state.numel()} bytes): was the run's run.rng other?")
        super().set_state(new_state[:-8].contiguous())
        self.counter.copy_(new_state[-8:].clone().view(torch.int64))  # in place: a captured graph holds it
        return self


class KeyedRows:
    """K keyed generators' keys and counters as rows of two [K] tensors (each generator's now views of its row),
    so every run's draw is one launch."""

    def __init__(self, generators: Sequence[KeyedGenerator]) -> None:
        self.generators = list(generators)
        self.keys = torch.cat([g.key for g in generators])
        self.counters = torch.cat([g.counter for g in generators])
        for i, generator in enumerate(generators):
            generator.key, generator.counter = self.keys[i : i + 1], self.counters[i : i + 1]
            generator.rows = self
        self.index: dict[tuple[int, ...], Tensor] = {}  # runs -> their rows, made eagerly (a capture's warm-up)

    @staticmethod
    def of(generators: Sequence[torch.Generator]) -> KeyedRows | None:
        """The rows of `generators` if every one is keyed (made the first time, the same after); None otherwise.
        A generator is a row of one pack only: its tensors are the ones a captured graph holds."""
        keyed = [g for g in generators if isinstance(g, KeyedGenerator)]
        if not keyed or len(keyed) < len(generators):
            return None
        rows = keyed[0].rows
        if rows is not None and rows.generators == keyed:
            return rows
        if any(g.rows is not None for g in keyed):
            raise ValueError("a keyed generator draws as a row of one pack only, in that pack's order")
        return KeyedRows(keyed)

    def draw_(self, out: Tensor, kind: str, runs: Sequence[int] | None = None, high: int = 0) -> Tensor:
        """Row l of `out` [L, ...] from run runs[l]'s generator (every run's, in order, when None)."""
        key = tuple(range(len(self.generators))) if runs is None else tuple(runs)
        if key not in self.index:
            self.index[key] = torch.tensor(key, dtype=torch.int64, device=self.keys.device)
        return keyed_draw_(out, self.keys, self.counters, self.index[key], kind, high)


def uniform_(out: Tensor, generator: torch.Generator) -> Tensor:
    """U[0, 1) into `out` from `generator`: keyed, or torch's own `uniform_`."""
    if isinstance(generator, KeyedGenerator):
        return generator.draw_(out, UNIFORM)
    return out.uniform_(generator=generator)


def normal_(out: Tensor, generator: torch.Generator) -> Tensor:
    if isinstance(generator, KeyedGenerator):
        return generator.draw_(out, NORMAL)
    return out.normal_(generator=generator)


def randint_(out: Tensor, high: int, generator: torch.Generator) -> Tensor:
    """Integers in [0, high) into `out` (int64)."""
    if isinstance(generator, KeyedGenerator):
        return generator.draw_(out, RANDINT, high)
    return out.random_(0, high, generator=generator)


def rows_draw_(
    out: Tensor, generators: Sequence[torch.Generator], kind: str, runs: Sequence[int] | None = None, high: int = 0
) -> Tensor:
    """Row l of `out` [L, ...] from generators[runs[l]] (each generator in turn when None), in the order a solo
    run draws (a generator's draws stay in call order): one launch where all are keyed, else one a row."""
    rows = KeyedRows.of(generators)
    if rows is not None:
        return rows.draw_(out, kind, runs, high)
    chosen = generators if runs is None else [generators[i] for i in runs]
    for row, generator in zip(out, chosen, strict=True):
        if kind == RANDINT:
            randint_(row, high, generator)
        elif kind == NORMAL:
            normal_(row, generator)
        else:
            uniform_(row, generator)
    return out


def make_generator(seed: int, stream: str, device: torch.device | str, rng: str) -> torch.Generator:
    """A run's generator of `stream` under `run.rng`: torch's (seeded as before) or keyed."""
    if rng == "keyed":
        return KeyedGenerator(seed, stream, device)
    offsets = {"step": 0, "explore": 1, "market": 0}  # torch's streams: seed, seed + 1, and the market's own seed
    return torch.Generator(device=device).manual_seed(seed + offsets[stream])
