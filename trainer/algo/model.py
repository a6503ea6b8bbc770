"""The pinned model as flat parameter buffers and pure forward functions.

Each network's parameters live in ONE contiguous tensor; `ParamLayout.views(flat)` cuts it into named,
differentiable views. So a gradient is one flat tensor, Adam and the target EMA are a few passes over
one buffer, and budget clipping is one norm per loss: the shapes the GPU plans need, written once.

Under mixed precision (`trainer.algo.step.mixed_precision`: autocast) the matrix products and attention
run in bf16 while the parameters stay float32; each network's last layer (`output_layer`) too, its
output cast to float32, so every loss, softmax and projection downstream is float32 whatever the device's
autocast lists (round 3: a float32 last layer cost four TF32 products as long as the bf16 rest, within
the same tolerance; `trainer.execution.plans.fused.BF16_RTOL`).

Networks (letters: B batch, K branches, A actions, N atoms, T taus, W window, F features, H hidden):
- `main`: trunk (F→H→H), C51 dueling heads (value H→h→N, advantage H→h→K·A·N), IQN head
  (cos(τ) → H, ⊙ h_s2, H→h→K·A) and E optional extra advantage heads. Budgeted gradients, EMA target.
- `iql`: V(h_s2.detach()) H→h→1, its own Adam.
- `attn`: window [W, F] → D, one 4-head self-attention block with FFN and 2 LayerNorms, mean-pool,
  head D→F predicting the next state; its own Adam.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as fn
from torch import Tensor

from contracts.config import ModelConfig
from trainer.algo.losses.c51 import dueling_logits, expected_q
from trainer.algo.losses.iqn import cosine_features


@dataclass(frozen=True)
class ModelDims:
    """The networks' sizes: the data source's (`DATA_DIMS`), then ModelConfig's fields of the same names."""

    obs_dim: int  # F
    branches: int  # K
    actions: int  # A
    atoms: int  # N
    hidden: int  # H
    head_hidden: int
    iqn_embed: int
    iqn_hidden: int
    iqn_taus: int  # T
    iqn_target_taus: int  # T'
    iql_hidden: int
    attn_window: int  # W
    attn_dim: int  # D
    attn_heads: int
    attn_ffn: int
    ensemble_heads: int  # E
    v_min: float
    v_max: float

    @classmethod
    def build(cls, model: ModelConfig, obs_dim: int, branches: int, actions: int) -> ModelDims:
        """The data source's sizes as given; every other field is `model`'s field of the same name."""
        config = model.model_dump()
        copied = {f.name: config[f.name] for f in fields(cls) if f.name not in DATA_DIMS}
        return cls(obs_dim=obs_dim, branches=branches, actions=actions, **copied)


DATA_DIMS = frozenset({"obs_dim", "branches", "actions"})
"""ModelDims' fields that come from the data source, not from ModelConfig."""


ALIGN = 8
"""Elements every parameter starts at a multiple of, and padded dimensions are rounded up to: 8 × bf16 =
16 bytes (8 × float32 = 32), the alignment cuBLAS's tensor-core tiles need. An output width of 765 (K·A·N)
or a parameter at an odd offset sends a product to cuBLAS's 1-element-aligned kernels (round 2's slowest)."""

PADDED = "_padded"
"""`views` key suffix of a padded parameter's whole stored block (`adv2_w_padded`: [768, h] for [765, h])."""


def round_up(n: int, multiple: int = ALIGN) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    fan_in: int  # for the uniform(±1/sqrt(fan_in)) init of nn.Linear; 0 = LayerNorm (ones/zeros)
    matrix: bool = False  # a weight matrix: spectral norm and pruning apply
    pad_dim: int | None = None
    """A dimension stored rounded up to `ALIGN` (zeros past `shape`: an output layer's extra rows, whose
    outputs are sliced away, so their gradient, Adam moments and values stay exactly zero)."""

    @property
    def stored(self) -> tuple[int, ...]:
        """The shape the flat buffer holds: `shape` with `pad_dim` rounded up to `ALIGN`."""
        if self.pad_dim is None:
            return self.shape
        shape = list(self.shape)
        shape[self.pad_dim] = round_up(shape[self.pad_dim])
        return tuple(shape)


class ParamLayout:
    """Named slices of one flat parameter tensor.

    `groups` name runs of parameters kept adjacent in memory (in the order given, where the first of
    them is in `specs`), so each group is one more view: e.g. the heads' first-layer weights as one
    matrix, whose one product replaces one per head. `specs` keeps its order for everything else
    (initialisation draws, spectral norm, pruning), so grouping moves parameters, never changes them.

    Every parameter (a group: its first) starts at a multiple of `ALIGN` elements, and a spec's
    `pad_dim` is stored rounded up (`ParamSpec.stored`). The gaps and pads are zeros no view of a
    parameter reads: `views[name]` is the parameter's own shape; `views[name + PADDED]` the padded block,
    for the forward functions' products.
    """

    def __init__(self, specs: list[ParamSpec], groups: dict[str, list[str]] | None = None) -> None:
        self.specs = specs
        self.groups = groups or {}
        shapes = {spec.name: spec.stored for spec in specs}
        group_of = {name: group for group, names in self.groups.items() for name in names}
        order: list[str] = []
        for spec in specs:
            if spec.name not in order:
                order += self.groups[group_of[spec.name]] if spec.name in group_of else [spec.name]
        self.offsets: dict[str, tuple[int, int]] = {}
        offset = 0
        for name in order:
            if name not in group_of or self.groups[group_of[name]][0] == name:
                offset = round_up(offset)  # a group's members stay adjacent: one view of them all
            size = math.prod(shapes[name])
            self.offsets[name] = (offset, offset + size)
            offset += size
        self.size = offset
        self.stored = {spec.name: spec.stored for spec in specs}
        self.group_shapes: dict[str, tuple[int, ...]] = {}
        for group, names in self.groups.items():
            first = shapes[names[0]]
            if len({shapes[name][-1] for name in names}) != 1 and len(first) > 1:
                raise ValueError(f"parameter group {group}: members must share their last dimension")
            rows = sum(math.prod(shapes[name]) for name in names)
            self.group_shapes[group] = (rows,) if len(first) == 1 else (rows // first[-1], first[-1])

    def views(self, flat: Tensor) -> dict[str, Tensor]:
        """Differentiable views of `flat` [P], one per parameter in its shape, and one per group. Of
        stacked networks `flat` [S, P] (`trainer.algo.step.compute_targets` stacks online and target), each view
        has the leading dim S too."""
        lead = flat.shape[:-1]
        views: dict[str, Tensor] = {}
        for spec in self.specs:
            block = flat[..., self.offsets[spec.name][0] : self.offsets[spec.name][1]].view(*lead, *spec.stored)
            if spec.pad_dim is None:
                views[spec.name] = block
                continue
            views[spec.name + PADDED] = block
            views[spec.name] = block.narrow(len(lead) + spec.pad_dim, 0, spec.shape[spec.pad_dim])
        for group, names in self.groups.items():
            start, end = self.offsets[names[0]][0], self.offsets[names[-1]][1]
            views[group] = flat[..., start:end].view(*lead, *self.group_shapes[group])
        return views

    def init(self, generator: torch.Generator, device: torch.device) -> Tensor:
        """nn.Linear's default init (uniform ±1/sqrt(fan_in)) for weights and biases; LayerNorm 1/0."""
        flat = torch.zeros(self.size, device=device)  # the gaps and pads stay zero
        views = self.views(flat)
        for spec in self.specs:
            view = views[spec.name]
            if spec.fan_in == 0:
                view.fill_(1.0 if spec.name.endswith("_w") else 0.0)
                continue
            bound = 1.0 / math.sqrt(spec.fan_in)
            cpu = torch.rand(spec.shape, generator=generator) * 2 * bound - bound
            view.copy_(cpu)
        return flat

    def matrices(self) -> list[ParamSpec]:
        return [spec for spec in self.specs if spec.matrix]


def _linear(name: str, out_dim: int, in_dim: int, matrix: bool = True, pad_out: bool = False) -> list[ParamSpec]:
    """nn.Linear's weight [out, in] and bias [out]; `pad_out`: the output rows stored padded to `ALIGN`."""
    pad = 0 if pad_out else None
    return [
        ParamSpec(f"{name}_w", (out_dim, in_dim), in_dim, matrix, pad),
        ParamSpec(f"{name}_b", (out_dim,), in_dim, pad_dim=pad),
    ]


def main_layout(d: ModelDims) -> ParamLayout:
    heads = d.branches * d.actions
    specs = [
        *_linear("trunk1", d.hidden, d.obs_dim),
        *_linear("trunk2", d.hidden, d.hidden),
        *_linear("value1", d.head_hidden, d.hidden),
        *_linear("value2", d.atoms, d.head_hidden, pad_out=True),
        *_linear("adv1", d.head_hidden, d.hidden),
        *_linear("adv2", heads * d.atoms, d.head_hidden, pad_out=True),
        *_linear("iqn_embed", d.hidden, d.iqn_embed),
        *_linear("iqn1", d.iqn_hidden, d.hidden),
        *_linear("iqn2", heads, d.iqn_hidden, pad_out=True),
    ]
    first_layers = ["value1", "adv1"]
    if d.ensemble_heads:
        e = d.ensemble_heads
        specs += [
            ParamSpec("ens1_w", (e, d.head_hidden, d.hidden), d.hidden),
            ParamSpec("ens1_b", (e, d.head_hidden), d.hidden),
            ParamSpec("ens2_w", (e, heads * d.atoms, d.head_hidden), d.head_hidden, pad_dim=1),
            ParamSpec("ens2_b", (e, heads * d.atoms), d.head_hidden, pad_dim=1),
        ]
        first_layers.append("ens1")
    # the heads' first layers side by side: value, advantage, ensemble rows of one [(2+E)·h, H] matrix
    groups = {"heads1_w": [f"{name}_w" for name in first_layers], "heads1_b": [f"{name}_b" for name in first_layers]}
    return ParamLayout(specs, groups)


def iql_layout(d: ModelDims) -> ParamLayout:
    return ParamLayout(
        [*_linear("iql1", d.iql_hidden, d.hidden, False), *_linear("iql2", 1, d.iql_hidden, False, pad_out=True)]
    )


def attn_layout(d: ModelDims) -> ParamLayout:
    D = d.attn_dim
    return ParamLayout(
        [
            *_linear("attn_embed", D, d.obs_dim, False),
            *_linear("attn_in", 3 * D, D, False),
            *_linear("attn_out", D, D, False),
            ParamSpec("attn_ln1_w", (D,), 0),
            ParamSpec("attn_ln1_b", (D,), 0),
            # the FFN's hidden width padded (700 -> 704): zero units, relu(0) = 0, that add nothing
            *_linear("attn_ffn1", d.attn_ffn, D, False, pad_out=True),
            ParamSpec("attn_ffn2_w", (D, d.attn_ffn), d.attn_ffn, pad_dim=1),
            ParamSpec("attn_ffn2_b", (D,), d.attn_ffn),
            ParamSpec("attn_ln2_w", (D,), 0),
            ParamSpec("attn_ln2_b", (D,), 0),
            *_linear("attn_head", d.obs_dim, D, False, pad_out=True),
        ]
    )


# ---------------------------------------------------------------- forward functions (pure)
# Each takes one network's views (`ParamLayout.views` of [P]: inputs [B, ...]) or S networks' stacked views
# (of [S, P]: inputs [S, B, ...], weights [S, out, in]), where every layer is one batched product for all S.


def affine(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """x Wᵀ + b: [B, in] -> [B, out]; of stacked networks, [S, B, in] -> [S, B, out] as one batched product.

    Stacked, the bias is added after the product, not by `baddbmm`: cuBLAS's batched product has no bias
    epilogue, so `baddbmm` first copies the broadcast bias into its output (one more kernel per layer, five
    in a step's target pass), where a separate add fuses into the next pointwise kernel (the ReLU)."""
    if weight.dim() == 2:
        return fn.linear(x, weight, bias)
    return torch.bmm(x, weight.transpose(-1, -2)) + bias.unsqueeze(-2)


def output_layer(hidden: Tensor, p: dict[str, Tensor], name: str) -> Tensor:
    """A network's last linear layer `name` (padded rows: `ParamSpec.pad_dim`), its output float32. Under
    mixed precision the product runs in bf16 like every other layer (float32 accumulation); its outputs
    (logits, quantiles, values) are rounded to bf16 once, then the losses run in float32. The product
    runs over the padded rows (an aligned width), whose outputs are sliced away here: so their gradient
    is exactly zero."""
    out = p[f"{name}_w"].shape[-2]
    return affine(hidden, p[f"{name}_w{PADDED}"], p[f"{name}_b{PADDED}"])[..., :out].float()


def trunk(p: dict[str, Tensor], obs: Tensor) -> Tensor:
    """h_s2 = relu(W2 relu(W1 s + b1) + b2)."""
    h_s1 = fn.relu(affine(obs, p["trunk1_w"], p["trunk1_b"]))  # [B, H]
    return fn.relu(affine(h_s1, p["trunk2_w"], p["trunk2_b"]))  # [B, H]


def head_hidden(p: dict[str, Tensor], h_s2: Tensor, d: ModelDims, ensemble: bool = False) -> Tensor:
    """The heads' first layers as ONE product: relu(W1 h_s2 + b1) with W1 the value, advantage (and, with
    `ensemble`, the E ensemble heads') weights stacked in `heads1_w`; a row prefix of it otherwise."""
    rows = (2 + (d.ensemble_heads if ensemble else 0)) * d.head_hidden
    weight, bias = p["heads1_w"].narrow(-2, 0, rows), p["heads1_b"].narrow(-1, 0, rows)
    return fn.relu(affine(h_s2, weight, bias))  # [B, (2(+E))·h]


def c51_logits(p: dict[str, Tensor], h_s2: Tensor, d: ModelDims, hidden: Tensor | None = None) -> Tensor:
    """Dueling per branch: logits = V + A − mean_a A (`hidden`: `head_hidden` of h_s2, if already computed)."""
    h = d.head_hidden
    hidden = head_hidden(p, h_s2, d) if hidden is None else hidden  # [B, ≥2h]
    rows = hidden.shape[:-1]  # (B,), or (S, B) of stacked networks
    value = output_layer(hidden[..., :h], p, "value2").reshape(-1, 1, 1, d.atoms)  # [B, 1, 1, N]
    advantage = output_layer(hidden[..., h : 2 * h], p, "adv2").reshape(-1, d.branches, d.actions, d.atoms)
    return dueling_logits(value, advantage).view(*rows, d.branches, d.actions, d.atoms)  # [B, K, A, N]


def ensemble_logits(p: dict[str, Tensor], h_s2: Tensor, d: ModelDims, hidden: Tensor | None = None) -> Tensor:
    """E extra advantage heads sharing the value stream, batched over heads (`hidden`: `head_hidden` of
    h_s2 with the ensemble's rows, if already computed)."""
    h, e = d.head_hidden, d.ensemble_heads
    hidden = head_hidden(p, h_s2, d, ensemble=True) if hidden is None else hidden  # [B, (2+E)·h]
    ens = hidden[:, 2 * h :].view(-1, e, h).transpose(0, 1)  # [E, B, h]
    w, b = p[f"ens2_w{PADDED}"], p[f"ens2_b{PADDED}"]  # [E, O, h], [E, O]: O = K·A·N padded to ALIGN
    adv = torch.einsum("ebh,eoh->ebo", ens, w) + b[:, None, :]  # [E, B, O]: an output layer, as `output_layer`
    adv = adv[..., : p["ens2_w"].shape[1]].float().view(e, -1, d.branches, d.actions, d.atoms)  # [E, B, K, A, N]
    value = output_layer(hidden[:, :h], p, "value2")[:, None, None, :]  # [B, 1, 1, N]
    return torch.stack([dueling_logits(value, adv[i]) for i in range(e)])  # [E, B, K, A, N]


def iqn_quantiles(p: dict[str, Tensor], h_s2: Tensor, tau: Tensor, d: ModelDims) -> Tensor:
    """Z_tau(s, ·) = f(ψ(s) ⊙ φ(τ)), φ(τ) = relu(W cos(π i τ) + b)."""
    phi = fn.relu(fn.linear(cosine_features(tau, d.iqn_embed), p["iqn_embed_w"], p["iqn_embed_b"]))  # [B, T, H]
    mixed = h_s2[:, None, :] * phi  # [B, T, H]
    hidden = fn.relu(fn.linear(mixed, p["iqn1_w"], p["iqn1_b"]))  # [B, T, h]
    return output_layer(hidden, p, "iqn2").view(*tau.shape, d.branches, d.actions)  # [B, T, K, A]


def iql_value(p: dict[str, Tensor], h_s2: Tensor) -> Tensor:
    hidden = fn.relu(fn.linear(h_s2, p["iql1_w"], p["iql1_b"]))  # [B, h]
    return output_layer(hidden, p, "iql2").squeeze(-1)  # [B]


def self_attention(qkv: Tensor) -> Tensor:
    """softmax(q kᵀ / √d) v per head, from the packed projections qkv [B, W, 3, h, d] -> [B, W, h, d]."""
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 × [B, h, W, d]
    return fn.scaled_dot_product_attention(q, k, v).transpose(1, 2)  # [B, W, h, d]


def attention_predict(
    p: dict[str, Tensor], window: Tensor, d: ModelDims, attend: Callable[[Tensor], Tensor] = self_attention
) -> Tensor:
    """Predict the next state from the window: post-LN self-attention block, mean-pooled. `attend` is how
    `self_attention` runs (the fused plans' Triton kernel, `trainer.execution.kernels.window_attention`)."""
    B, W, _ = window.shape
    D, heads = d.attn_dim, d.attn_heads
    x = fn.linear(window, p["attn_embed_w"], p["attn_embed_b"])  # [B, W, D]
    qkv = fn.linear(x, p["attn_in_w"], p["attn_in_b"]).view(B, W, 3, heads, D // heads)  # [B, W, 3, h, d]
    attended = attend(qkv).reshape(B, W, D)  # [B, W, D]
    x = fn.layer_norm(x + fn.linear(attended, p["attn_out_w"], p["attn_out_b"]), (D,), p["attn_ln1_w"], p["attn_ln1_b"])
    ffn_hidden = fn.relu(fn.linear(x, p[f"attn_ffn1_w{PADDED}"], p[f"attn_ffn1_b{PADDED}"]))  # [B, W, ffn padded]
    ffn = fn.linear(ffn_hidden, p[f"attn_ffn2_w{PADDED}"], p["attn_ffn2_b"])  # [B, W, D]
    x = fn.layer_norm(x + ffn, (D,), p["attn_ln2_w"], p["attn_ln2_b"])  # [B, W, D]
    return output_layer(x.mean(dim=1), p, "attn_head")  # [B, F]


def support(d: ModelDims, device: torch.device) -> Tensor:
    return torch.linspace(d.v_min, d.v_max, d.atoms, device=device)  # [N]


def greedy_action(p: dict[str, Tensor], obs: Tensor, d: ModelDims, atoms: Tensor) -> Tensor:
    """argmax_a E[Z(s, a)] per branch: the acting policy."""
    logits = c51_logits(p, trunk(p, obs), d)  # [B, K, A, N]
    return expected_q(logits, atoms).argmax(dim=-1)  # [B, K]
