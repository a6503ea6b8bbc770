"""The training job's configuration: one typed, documented document.

Imports no torch, so the controller (`service/`) validates jobs against the same schema the trainer
runs. Every field has a description and bounds; the CLI overrides fields by dotted path
(`-o optim.lr=3e-4`), and each run writes the resolved config beside its outputs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contracts.datasets import DatasetAccess
from contracts.plans import PlanName
from contracts.search import MAX_DIMENSIONS, SearchDimension
from contracts.yamlfile import read_yaml

STEPS_PER_EPOCH = 2000
C51_KERNEL_MAX_ATOMS = 128
"""The most atoms run.c51_target_kernel = triton takes: a program holds an [N, N] weight tile in registers."""
IQN_KERNEL_MAX_WIDTH = 256
"""The widest iqn_embed, iqn_hidden and branches x actions run.iqn_target_kernel = triton takes: each is one tile
of a program (`trainer.execution.kernels.iqn`). The config checks the first two; the data source's branches x
actions, the kernel when the step first runs."""
TARGET_MLP_KERNEL_MAX_WIDTH = 256
"""The widest hidden and head_hidden run.target_mlp_kernel = triton takes: each is one tile of a program
(`trainer.execution.kernels.mlp`); the features and the atoms are taken in chunks, any number of them."""
TARGET_MLP_KERNEL_MAX_ACTIONS = 16
"""The most actions a branch run.target_mlp_kernel = triton takes (its advantage tile holds them all, 16 atoms each).
The config checks the widths; the data source's actions, the kernel when the step first runs."""
INT32_MAX = 2**31 - 1
"""Bound of every count without a smaller natural one: the store, the trainer and Argo all hold it."""


class ConfigError(ValueError):
    """A config that cannot be used; the message is one line naming the field and the bad value."""


class _Section(BaseModel):
    """Every section: unknown keys, non-finite floats (NaN, Infinity, 1e400) and NUL in strings are refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        if isinstance(value, str) and "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


class ModelConfig(_Section):
    """Widths of the networks. Observation size and action branches come from the data source."""

    hidden: int = Field(256, ge=1, le=8192, description="Trunk width (h_s1, h_s2).")
    head_hidden: int = Field(128, ge=1, le=8192, description="Hidden width of the value/advantage heads.")
    atoms: int = Field(51, ge=2, le=1001, description="C51 atoms N on the support.")
    v_min: float = Field(-10.0, ge=-1e6, le=1e6, description="Lowest atom of the value support.")
    v_max: float = Field(10.0, ge=-1e6, le=1e6, description="Highest atom of the value support.")
    iqn_embed: int = Field(64, ge=1, le=1024, description="Cosine features of tau in the IQN embedding.")
    iqn_hidden: int = Field(128, ge=1, le=8192, description="Hidden width of the IQN head.")
    iqn_taus: int = Field(32, ge=1, le=1024, description="Online quantile samples T per state.")
    iqn_target_taus: int = Field(32, ge=1, le=1024, description="Target quantile samples T' per state.")
    iql_hidden: int = Field(64, ge=1, le=8192, description="Hidden width of the IQL value network.")
    attn_window: int = Field(16, ge=1, le=1024, description="States W in the attention window.")
    attn_dim: int = Field(128, ge=4, le=4096, description="Attention model width.")
    attn_heads: int = Field(4, ge=1, le=64, description="Attention heads (must divide attn_dim).")
    attn_ffn: int = Field(700, ge=1, le=16384, description="Attention feed-forward width.")
    ensemble_heads: int = Field(0, ge=0, le=64, description="Extra advantage heads E (0 disables the ensemble).")

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.v_max <= self.v_min:
            raise ValueError(f"v_max ({self.v_max}) must be greater than v_min ({self.v_min})")
        if self.attn_dim % self.attn_heads:
            raise ValueError(f"attn_heads ({self.attn_heads}) must divide attn_dim ({self.attn_dim})")
        return self


class LossConfig(_Section):
    """Which losses and regularisers run, and their weights."""

    gamma: float = Field(0.99, gt=0.0, le=1.0, description="Discount factor.")
    reward_scale: float = Field(1.0, gt=0.0, description="Rewards are multiplied by this before learning.")
    cql: bool = Field(True, description="Conservative Q-learning penalty on expected Q.")
    cql_alpha: float = Field(0.1, ge=0.0, description="Weight of the CQL penalty.")
    iqn: bool = Field(True, description="IQN head; its per-sample loss sets PER priorities.")
    iqn_kappa: float = Field(1.0, gt=0.0, description="Huber threshold kappa of the quantile loss.")
    iql: bool = Field(True, description="IQL expectile value step (own Adam).")
    iql_expectile: float = Field(0.7, gt=0.0, lt=1.0, description="Expectile of the IQL value.")
    attention: bool = Field(True, description="Attention auxiliary predicting the next state (own Adam).")
    ensemble_diversity: float = Field(0.1, ge=0.0, description="Weight of the ensemble diversity penalty.")
    vaccine: bool = Field(False, description="Adversarial (FGSM) robustness penalty every vaccine_every steps.")
    vaccine_every: int = Field(10, ge=1, le=INT32_MAX, description="Steps between vaccine updates.")
    vaccine_epsilon: float = Field(0.01, ge=0.0, description="FGSM step size on the states.")
    vaccine_weight: float = Field(0.1, ge=0.0, description="Weight of the vaccine penalty (C51 budget).")
    causal: bool = Field(False, description="Causal intervention probe every causal_every steps (no gradient).")
    causal_every: int = Field(100, ge=1, le=INT32_MAX, description="Steps between causal intervention probes.")


class OptimConfig(_Section):
    """Adam, gradient budgets, spectral norm, pruning and target updates."""

    lr: float = Field(1e-4, gt=0.0, le=1.0, description="Adam learning rate of the main network.")
    aux_lr: float = Field(3e-4, gt=0.0, le=1.0, description="Adam learning rate of IQL and attention.")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="Adam beta1.")
    beta2: float = Field(0.999, ge=0.0, lt=1.0, description="Adam beta2.")
    eps: float = Field(1e-8, gt=0.0, description="Adam epsilon (also the budget clip's epsilon).")
    max_grad_norm: float = Field(10.0, gt=0.0, description="Total gradient norm shared out by the budgets.")
    budget_c51: float = Field(0.60, ge=0.0, le=1.0, description="Share of max_grad_norm for the C51 gradient.")
    budget_cql: float = Field(0.25, ge=0.0, le=1.0, description="Share for the CQL gradient.")
    budget_iqn: float = Field(0.10, ge=0.0, le=1.0, description="Share for the IQN gradient.")
    budget_ensemble: float = Field(0.05, ge=0.0, le=1.0, description="Share for the ensemble gradient.")
    target_tau: float = Field(0.005, gt=0.0, le=1.0, description="EMA rate: target <- lerp(target, online, tau).")
    spectral_norm: bool = Field(True, description="Bound each trunk/head weight's largest singular value.")
    sigma_max: float = Field(5.0, gt=0.0, description="Largest allowed singular value per weight matrix.")
    prune_sparsity: float = Field(0.0, ge=0.0, lt=1.0, description="Fraction of weights masked to zero at init.")

    @model_validator(mode="after")
    def _budgets(self) -> OptimConfig:
        total = self.budget_c51 + self.budget_cql + self.budget_iqn + self.budget_ensemble
        if total > 1.0 + 1e-6:
            raise ValueError(f"gradient budgets sum to {total:.3f}; they must sum to at most 1")
        return self


class ReplayConfig(_Section):
    """GPU-resident prioritised replay: P(i) = p_i^alpha / sum p^alpha, w_i = (N P(i))^-beta / max w."""

    capacity: int = Field(1_000_000, ge=16, le=100_000_000, description="Transitions kept (ring buffer).")
    alpha: float = Field(0.6, ge=0.0, le=1.0, description="Priority exponent alpha (0 = uniform).")
    beta_start: float = Field(0.4, ge=0.0, le=1.0, description="Importance-weight exponent at step 0.")
    beta_end: float = Field(1.0, ge=0.0, le=1.0, description="Importance-weight exponent at the last step.")
    priority_eps: float = Field(1e-6, gt=0.0, description="Added to |loss| so no priority is zero.")
    storage_dtype: Literal["float32", "bfloat16"] = Field("float32", description="dtype of stored states.")
    her: bool = Field(True, description="HER relabelling of goal-conditioned transitions (if the env has goals).")
    her_ratio: float = Field(0.5, ge=0.0, le=1.0, description="Fraction of sampled transitions relabelled.")
    search: Literal["tree", "cdf"] = Field(
        "tree", description="Sampling search: sum-tree descent, or a cumulative sum + binary search (fewer kernels)."
    )


ENV_ID = re.compile(r"(?:[A-Za-z0-9_-]+/)?[A-Za-z0-9_.-]+")
"""The form of a registered Gymnasium id, `[namespace/]Name[-vN]`, without the `module:` prefix."""
MAX_ENV_ID = 200


def env_id_problem(env_id: object) -> str | None:
    """Why `env_id` may not reach Gymnasium, or None.

    For an id `module:Name` Gymnasium imports `module` before it looks the name up, so such an id in a
    job's config or a dataset's metadata would run that module's code in the trainer. Only the form a
    registered id has is let through; whether one is registered the trainer asks Gymnasium's registry."""
    if not isinstance(env_id, str):
        return f"must be a Gymnasium id (a string), got {type(env_id).__name__}"
    if len(env_id) <= MAX_ENV_ID and ENV_ID.fullmatch(env_id):
        return None
    if ":" in env_id:
        return (
            "is module-qualified (module:Name): Gymnasium would import that module in the trainer, so only "
            "registered ids are taken, [namespace/]Name[-vN] (e.g. CartPole-v1)"
        )
    return (
        "is not a registered Gymnasium id: [namespace/]Name[-vN], of ASCII letters, digits, '_', '-' and '.', "
        f"at most {MAX_ENV_ID} characters (e.g. CartPole-v1)"
    )


def check_env_id(env_id: object, what: str = "data.env_id") -> str:
    """`env_id` if Gymnasium may be given it (`env_id_problem`); else a one-line ConfigError naming `what`."""
    problem = env_id_problem(env_id)
    if problem is not None:
        shown = repr(env_id[:80] + "…" if isinstance(env_id, str) and len(env_id) > 80 else env_id)
        raise ConfigError(f"{what} {shown} {problem}" if isinstance(env_id, str) else f"{what} {problem}")
    assert isinstance(env_id, str)
    return env_id


class DataConfig(_Section):
    """Where transitions come from."""

    source: Literal["market", "gym", "offline"] = Field("market", description="Data source kind.")
    env_id: str = Field(
        "CartPole-v1",
        description=(
            "Registered Gymnasium environment id, [namespace/]Name[-vN] (source=gym); a module-qualified id "
            "(module:Name) is refused."
        ),
    )
    dataset: str | None = Field(None, description="Offline dataset path or fsspec URL (.parquet or .npz).")
    dataset_access: DatasetAccess | None = Field(
        None,
        description=(
            "Where data.dataset may come from and how large it may be: set by the controller from its settings "
            "(a job may not set it), and enforced by the trainer when it reads the file. None: anything."
        ),
    )
    num_envs: int = Field(1, ge=1, le=4096, description="Parallel environments for online collection.")
    vector_env: Literal["sync", "async", "process"] = Field(
        "sync",
        description=(
            "Gymnasium vector env of the host-side envs (gym, and the market's numpy backend): 'sync' steps the "
            "data.num_envs envs in turn in this process; 'async' steps them in parallel in worker processes, "
            "one per env, which pays when an env step costs more than a process round trip (about 0.1 ms); "
            "'process' steps them in turn in one worker process of their own, so that the runs of a pack "
            "(trainer sweep --pack) step their envs in parallel, a process per run rather than per env."
        ),
    )
    learning_starts: int = Field(1000, ge=0, le=INT32_MAX, description="Transitions collected before the first update.")
    env_steps_per_update: int = Field(1, ge=1, le=4096, description="Environment steps collected per update step.")
    epsilon_start: float = Field(1.0, ge=0.0, le=1.0, description="Initial epsilon of epsilon-greedy.")
    epsilon_end: float = Field(0.05, ge=0.0, le=1.0, description="Final epsilon of epsilon-greedy.")
    epsilon_decay_steps: int = Field(10_000, ge=1, le=INT32_MAX, description="Update steps to anneal epsilon over.")
    market_features: int = Field(64, ge=14, le=4096, description="Observation features of the market env.")
    market_horizon: int = Field(200, ge=8, le=INT32_MAX, description="Steps per market episode.")
    market_backend: Literal["auto", "numpy", "torch"] = Field(
        "auto",
        description=(
            "How the market env runs: 'torch' steps all data.num_envs envs as tensors on the training device "
            "(no host round trip, capturable); 'numpy' runs the Gymnasium MarketEnv in a vector env on the host; "
            "'auto' takes torch when the training device is a GPU, numpy otherwise."
        ),
    )

    @field_validator("env_id")
    @classmethod
    def _env_id(cls, env_id: str) -> str:
        problem = env_id_problem(env_id)
        if problem is not None:
            raise ValueError(f"{env_id[:80]!r} {problem}")
        return env_id

    @model_validator(mode="after")
    def _dataset(self) -> DataConfig:
        if self.source == "offline" and not self.dataset:
            raise ValueError("data.dataset is required when data.source is 'offline'")
        return self


class RunConfig(_Section):
    """How long, where, and how the run reports."""

    seed: int = Field(0, ge=0, le=INT32_MAX, description="Seed of every random generator.")
    steps: int = Field(2000, ge=1, le=INT32_MAX, description="Update steps in the whole run.")
    batch_size: int = Field(1024, ge=1, le=1 << 20, description="Transitions per update (B).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="'auto' takes a GPU when present.")
    plan: PlanName = Field("eager", description="Execution plan; an unrunnable plan falls back to eager.")
    cpu_threads: int | None = Field(
        None, ge=1, le=1024, description="torch CPU threads (None: torch's default); small CPU models run best on 1."
    )
    steps_per_replay: int = Field(
        1,
        ge=1,
        le=1000,
        description="Updates per graph replay on the graph plans (graph, dual, fused, zerocopy); the loop collects "
        "that many updates' rows before each replay.",
    )
    iqn_loss_kernel: Literal["inductor"] = Field(
        "inductor",
        description=(
            "IQN's pairwise quantile Huber loss: Inductor's kernel, which already fuses the loss and its "
            "gradient into one; the separate Triton kernel ('triton') was removed (issue 14: it replaced that one "
            "kernel by itself plus copies of its inputs). Kept so that stored configs naming it still load."
        ),
    )
    c51_target_kernel: Literal["auto", "inductor", "triton"] = Field(
        "auto",
        description=(
            "How the fused and zerocopy plans compute the C51 target on a GPU (the Double-DQN gather, the target "
            "softmax and the projection): Inductor's fusion of the written form ('inductor'), or one Triton kernel "
            f"with one program per sample ('triton', at most {C51_KERNEL_MAX_ATOMS} atoms); 'auto' is 'triton' "
            "where the atoms fit, else 'inductor'. On an H100 'triton' took `core`'s zerocopy-bf16+combo step "
            "from 0.836 and 0.841 ms to 0.799 and 0.798 ms (two compilations each, 2026-12-06). Compiled packs whose "
            "runs share gamma follow it too; no effect on the other plans, nor on the CPU."
        ),
    )
    iqn_target_kernel: Literal["auto", "inductor", "triton"] = Field(
        "auto",
        description=(
            "How the fused and zerocopy plans compute IQN's target quantiles on a GPU (the target network's quantile "
            "head at s', the Double-DQN gather and r + gamma (1 - done) Z): Inductor's products and pointwise kernels "
            f"('inductor'), or one Triton kernel that keeps each row's activations on chip ('triton', iqn_embed, "
            f"iqn_hidden and the data's branches x actions at most {IQN_KERNEL_MAX_WIDTH}); 'auto' is 'triton' where "
            "it was measured faster, run.precision 'bf16' with the widths in range, else 'inductor'. On an H100 "
            "'triton' took `core`'s zerocopy-bf16+combo step from 0.791 to 0.765 ms (2026-12-07). Compiled packs whose "
            "runs share gamma follow it too; no effect on the other plans, nor on the CPU."
        ),
    )
    iqn_online_kernel: Literal["inductor", "triton"] = Field(
        "inductor",
        description=(
            "How the fused and zerocopy plans compute the online IQN pass on a GPU (the quantile head at s for the "
            "T taus, at the batch's actions) and its gradient: Inductor's products and kernels ('inductor'), or "
            "Triton kernels that recompute the rows' activations on chip, a forward and two backward ('triton', "
            f"the widths as for iqn_target_kernel, at most {IQN_KERNEL_MAX_WIDTH}). The kernels' first form took "
            "core's bf16 step from 0.79 to 1.27 ms on an H100 (its backward added the weight gradients atomically); "
            "this second form, without atomics, took it to 0.792 ms against 0.776 for 'inductor' (H100, 2026-12-07, "
            "each compiled afresh), so 'inductor' stays the default. Compiled packs follow it too; no effect on the "
            "other plans, nor on the CPU."
        ),
    )
    target_mlp_kernel: Literal["inductor", "triton"] = Field(
        "inductor",
        description=(
            "How the fused and zerocopy plans run the step's first network pass on a GPU (the online and target "
            "networks' trunk and C51 dueling heads at s and s', no gradient): Inductor's five products and its "
            "pointwise kernels ('inductor'), or one Triton kernel that keeps each state's activations on chip "
            f"('triton', model.hidden and model.head_hidden at most {TARGET_MLP_KERNEL_MAX_WIDTH}, the data's "
            f"actions a branch at most {TARGET_MLP_KERNEL_MAX_ACTIONS}). On an H100 the kernel took `core`'s step "
            "to 0.914 ms against 0.779 (docs/benchmarks/README.md, issue 32 round 24), so 'inductor' stays the "
            "default. Packs of runs run the written form; no effect on the other plans, nor on the CPU."
        ),
    )
    rng: Literal["torch", "keyed"] = Field(
        "torch",
        description=(
            "Where the draws a run makes while it trains come from (the replay's sampling, HER's, the step's taus, "
            "epsilon-greedy's, the torch market's noise, in training and evaluation episodes alike): torch's "
            "generators ('torch'), or counter-based ones "
            "('keyed', `trainer.algo.rng`: each draw a hash of the run's seed, a counter and the element), with "
            "which a pack of K runs draws all of theirs in one launch instead of K. A pack's run i draws what its "
            "solo run does, except, so far, in a captured pack on a GPU under 'keyed': its graph parts from its "
            "solo graphs after the first replay (packs round 14, 2.7e-3; cause not yet found), which is why 'keyed' "
            "is not the default. 'keyed' draws other numbers than 'torch', so a recipe's figures are torch's. "
            "Measured on an H100 (packs round 14): the market's keyed pack of 16 learns on every seed and makes "
            "6,351 updates/s, 7.00x its solo run, against 5.82x with torch's draws."
        ),
    )
    precision: Literal["auto", "fp32", "tf32", "bf16"] = Field(
        "auto",
        description=(
            "Matrix-product precision of the update: 'auto' is the plan's own (TF32 for fused and zerocopy, "
            "float32 otherwise); 'bf16' runs the networks' matrix products and attention in bfloat16 "
            "(autocast, TF32 for the rest) with float32 master weights, Adam and losses."
        ),
    )
    combo_kernels: bool = Field(
        False,
        description=(
            "Compile the fused and zerocopy plans with Inductor's combined kernels (independent small Triton "
            "kernels launched as one, kept where Inductor measures them faster): on an H200, the pinned model's "
            "bf16 zerocopy step runs in 0.99 ms instead of 1.38 (docs/benchmarks, round 5), for about 70 s more "
            "compilation at start. A compiled pack of runs takes them too, every combination kept, since their "
            "benchmark breaks its sampling (docs/benchmarks, packs round 10). No effect on the other plans, nor on "
            "the CPU."
        ),
    )
    pack_split_k: bool = Field(
        False,
        description=(
            "A compiled pack of runs computes each batched product over 1,024 rows a run or more with a small result "
            "(the market's attention and IQN weight gradients) as products of the rows' chunks and a sum over them "
            "(split-K by hand: trainer.execution.split_k), where cuBLAS would loop every run's tiles over all its "
            "rows. The products alone took a third of the time, but the market pack of 16 ran 5,829 updates/s with "
            "it against 6,027 without (H100, 2026-12-07), so it stays off. No effect on solo runs."
        ),
    )
    log_every: int = Field(500, ge=1, le=INT32_MAX, description="Steps between breakdown lines.")
    checkpoint_every: int = Field(1000, ge=1, le=INT32_MAX, description="Steps between checkpoints.")
    eval_episodes: int = Field(10, ge=0, le=100_000, description="Greedy evaluation episodes at the end.")
    eval_every: int = Field(
        0,
        ge=0,
        le=INT32_MAX,
        description=(
            "Steps between greedy evaluations that keep the best policy, which is restored before the final "
            "evaluation (0: off, the last policy is evaluated)."
        ),
    )
    eval_select_episodes: int = Field(
        5, ge=1, le=10_000, description="Greedy episodes per evaluation of run.eval_every (seeds apart from the final)."
    )
    stop_at_return: float | None = Field(
        None,
        description=(
            "Stop once a periodic greedy evaluation (run.eval_every) reaches this mean return, and finish as at "
            "the end: checkpoint, the best policy, final evaluation, summary (None: train to run.steps). For a "
            "task with a known 'solved' return (CartPole-v1: 500), so a run that has solved it stops spending."
        ),
    )
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Serve /metrics here while running.")
    pushgateway_url: str | None = Field(
        None,
        description=(
            "Push a final metrics snapshot here (else to FOXHUNT_PUSHGATEWAY_URL). For a config run by hand: a job "
            "may not set it (the Pushgateway is the operator's), its trainer pushes to FOXHUNT_PUSHGATEWAY_URL."
        ),
    )
    max_seconds: float | None = Field(
        None,
        gt=0.0,
        description=(
            "Wall seconds of the training loop (a resumed run counts its earlier time) after which the run stops "
            "before run.steps and finishes as at the end: checkpoint, selection, final evaluation, summary "
            "(None: no limit). For a time budget that must end with a result."
        ),
    )
    collect_graph: bool = Field(
        True,
        description=(
            "Capture the torch market's collection on a CUDA device (data.market_backend torch): the "
            "run.steps_per_replay x data.env_steps_per_update collection steps before each plan call (acting "
            "epsilon-greedily, stepping, storing with the replay writer's bookkeeping on the device) replay as one "
            "CUDA graph, timed as the one component collect_graph; the same numbers as uncaptured collection. Applies "
            "while those steps fit in one market episode; off, or elsewhere, collection runs an operation at a time, "
            "timed as act, env and store. On an H200 it equals uncaptured collection bit for bit "
            "(tests/trainer/execution/test_collect.py) and "
            "cuts the market's collection from 0.91 to 0.28 ms per update."
        ),
    )


class SearchConfig(_Section):
    """A hyper-parameter search's space (a job with hyperopt_trials; `trainer hyperopt`). A single run ignores it."""

    space: dict[str, SearchDimension] | None = Field(
        None,
        max_length=MAX_DIMENSIONS,
        description=(
            "Dotted config field -> {type: float|int|categorical, low, high, log, step, choices}; None: the default "
            "space (contracts/search.py DEFAULT_SPACE). Trials pack several to a pod when only the seed and numeric "
            "hyper-parameters differ (contracts/packs.py PACKABLE); a searched shape or switch puts trials that drew "
            "different values of it in different pods."
        ),
    )


class TrainConfig(_Section):
    """Everything one training job needs; the controller's job schema embeds it unchanged."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)

    @model_validator(mode="after")
    def _searched_fields_exist(self) -> TrainConfig:
        for name in self.search.space or {}:
            section, _, field = name.partition(".")
            model = type(self).model_fields.get(section) if section != "search" else None
            if model is None or field not in model.annotation.model_fields:  # type: ignore[union-attr]
                raise ValueError(f"search.space: {name!r} is not a config field to search (section.field: optim.lr)")
        return self

    @model_validator(mode="after")
    def _fits(self) -> TrainConfig:
        if self.run.batch_size > self.replay.capacity:
            raise ValueError(f"run.batch_size ({self.run.batch_size}) exceeds replay.capacity ({self.replay.capacity})")
        return self

    @model_validator(mode="after")
    def _c51_kernel_fits(self) -> TrainConfig:
        if self.run.c51_target_kernel == "triton" and self.model.atoms > C51_KERNEL_MAX_ATOMS:
            raise ValueError(
                f"run.c51_target_kernel 'triton' takes at most {C51_KERNEL_MAX_ATOMS} atoms; model.atoms is "
                f"{self.model.atoms} (use 'inductor')"
            )
        return self

    @model_validator(mode="after")
    def _iqn_kernel_fits(self) -> TrainConfig:
        model = self.model
        widths = {"model.iqn_embed": model.iqn_embed, "model.iqn_hidden": model.iqn_hidden}
        too_wide = {name: width for name, width in widths.items() if width > IQN_KERNEL_MAX_WIDTH}
        asked = [name for name in ("iqn_target_kernel", "iqn_online_kernel") if getattr(self.run, name) == "triton"]
        if asked and too_wide:
            named = ", ".join(f"{name} is {width}" for name, width in too_wide.items())
            raise ValueError(
                f"run.{asked[0]} 'triton' takes widths of at most {IQN_KERNEL_MAX_WIDTH}; {named} (use 'inductor')"
            )
        return self

    @model_validator(mode="after")
    def _target_mlp_kernel_fits(self) -> TrainConfig:
        widths = {"model.hidden": self.model.hidden, "model.head_hidden": self.model.head_hidden}
        too_wide = {name: width for name, width in widths.items() if width > TARGET_MLP_KERNEL_MAX_WIDTH}
        if self.run.target_mlp_kernel == "triton" and too_wide:
            named = ", ".join(f"{name} is {width}" for name, width in too_wide.items())
            raise ValueError(
                f"run.target_mlp_kernel 'triton' takes widths of at most {TARGET_MLP_KERNEL_MAX_WIDTH}; {named} "
                "(use 'inductor')"
            )
        return self

    @model_validator(mode="after")
    def _stop_needs_evaluations(self) -> TrainConfig:
        if self.run.stop_at_return is not None and not self.run.eval_every:
            raise ValueError("run.stop_at_return needs run.eval_every > 0: only its evaluations can stop the run")
        return self

    @property
    def epochs(self) -> float:
        return self.run.steps / STEPS_PER_EPOCH


# ---- what a job asks beyond its config: the model, and its length in epochs ---------------------
MODELS: tuple[str, ...] = ("dqn",)
"""The models this trainer trains (a job's `model`): the distributional DQN of trainer/algo/model.py."""


def check_model(model: str) -> None:
    """Refuse a job's `model` that is not one of MODELS (ConfigError, one line naming them)."""
    if model not in MODELS:
        raise ConfigError(f"model {model!r} is not one this trainer trains; models: {', '.join(MODELS)}")


def check_steps_or_epochs(config: TrainConfig, epochs: int | None) -> None:
    """A job gives its length once: `run.steps` in the config, or epochs; both together are refused."""
    if epochs is None:
        return
    if "steps" in config.run.model_fields_set:
        raise ConfigError(
            f"the config sets run.steps ({config.run.steps}) and the job asks for {epochs} epochs: give one "
            f"(epochs become run.steps = epochs x {STEPS_PER_EPOCH})"
        )
    if not 1 <= epochs <= INT32_MAX // STEPS_PER_EPOCH:
        raise ConfigError(f"epochs must be between 1 and {INT32_MAX // STEPS_PER_EPOCH}, got {epochs}")


def check_job_settings(config: TrainConfig) -> None:
    """Refuse in a job's config what only the operator sets (ConfigError naming the field).

    `run.pushgateway_url` would have the trainer send HTTP requests to any address its pod reaches
    (server-side request forgery): a job's trainer pushes to the operator's Pushgateway,
    FOXHUNT_PUSHGATEWAY_URL, alone. The controller refuses such a job (422), and so does the job's resolve
    step; a config run by hand (`trainer train`) may still set it."""
    if config.run.pushgateway_url is not None:
        raise ConfigError(
            "run.pushgateway_url is the operator's to set, not a job's: a job's trainer pushes its metrics to the "
            "Pushgateway in FOXHUNT_PUSHGATEWAY_URL (the operator's environment); leave it out of the job's config"
        )


def apply_epochs(config: TrainConfig, epochs: int | None) -> TrainConfig:
    """The job's config with its epochs turned into run.steps (epochs x STEPS_PER_EPOCH); None: unchanged.

    The one place epochs become steps: the pipeline's resolve step (`trainer resolve --train-epochs`)
    calls it and writes the result, which every later step reads, so the config alone carries the steps.
    """
    check_steps_or_epochs(config, epochs)
    if epochs is None:
        return config
    resolved = config.model_copy(deep=True)
    resolved.run.steps = epochs * STEPS_PER_EPOCH
    return resolved


def format_validation_error(error: ValidationError) -> str:
    """One line per problem: `field.path: message (got value)`."""
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "config"
        got = f" (got {item['input']!r})" if "input" in item and not isinstance(item["input"], dict) else ""
        parts.append(f"{where}: {item['msg']}{got}")
    return "; ".join(parts)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted}: {key} is not a section")
    node[keys[-1]] = value


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """`["optim.lr=3e-4", "loss.cql=false"]` -> nested dict; values parse as YAML scalars."""
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. optim.lr=3e-4")
        key, raw = item.split("=", 1)
        _set_dotted(tree, key.strip(), _scalar(raw))
    return tree


def _scalar(raw: str) -> Any:
    """A YAML scalar, except that YAML 1.1's strings like `3e-4` are read as the numbers users mean."""
    value = yaml.safe_load(raw)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def with_values(base: TrainConfig, values: dict[str, Any], overrides: list[str] | None = None) -> TrainConfig:
    """`base` with each dotted field set to its exact value (a trial's parameters), then `overrides`, validated."""
    tree = base.model_dump(mode="json")  # a new document: the config is not touched
    for name, value in values.items():
        *sections, field = name.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: {section} is not a section")
        node[field] = value
    return build_config(tree, overrides)


def check_search(config: TrainConfig, trials: int, corners: dict[str, list[Any]] | None = None) -> None:
    """A job's search, checked before any trial runs (ConfigError, one line): a space only with trials, an
    objective to maximise, and each searched field's bounds and choices (`corners`; by default those of
    `search.space`) making a valid config, so that no trial fails on validation alone. The controller checks a
    job with it at submission, the trainer's suggest step again with the space it samples."""
    space = config.search.space or {}
    if trials < 1:
        if space:
            raise ConfigError("search.space is the space of a hyper-parameter search: the job asks for none (0 trials)")
        return
    if config.run.eval_episodes < 1:
        raise ConfigError(f"run.eval_episodes is {config.run.eval_episodes}: the search needs >= 1 for its objective")
    if corners is None:
        corners = {name: dimension.corners() for name, dimension in space.items()}
    for name, values in corners.items():
        for value in values:
            try:
                with_values(config, {name: value})
            except ConfigError as error:
                raise ConfigError(f"space {name}: {value!r} does not make a valid config: {error}") from None


def build_config(data: dict[str, Any] | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Validate a config document plus overrides, raising ConfigError with a one-line message."""
    tree = _merge(data or {}, parse_overrides(overrides or []))
    try:
        return TrainConfig.model_validate(tree)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read YAML or JSON (by content; JSON is YAML) from `path`, apply overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        loaded = read_yaml(path, "config file", ConfigError)
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: expected a mapping at the top level, got {type(loaded).__name__}")
        data = loaded or {}
    return build_config(data, overrides)


def dump_config(config: TrainConfig, path: str | Path) -> None:
    Path(path).write_text(json.dumps(config.model_dump(mode="json"), indent=2) + "\n")
