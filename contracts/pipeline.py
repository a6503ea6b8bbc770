"""A job's pipeline as data: a graph of trainer commands that both executors walk.

Metaflow's "same flow locally and on the cluster": the flow is data, and each runtime compiles or
executes it.
- `argo/render.py` compiles the graph to WorkflowTemplates with Hera: a `Graph` becomes a Steps
  template whose parallel groups are the graph's layers, a node's `when` an Argo `when`, a fan-out a
  `withParam` over the source step's output; the YAML under `argo/` is its committed output.
- `service/backends/local_pipeline.py` walks the same graph as local processes, in node order.

So adding a step (an evaluation after train, say) is one `Node` here, and both backends run it. Each
step's arguments are written out as the trainer CLI spells them; `tests/trainer/test_pipeline.py`
parses every command back with the CLI, so a renamed option fails there, not on a cluster.

Placeholders are `str.format` fields, bound by each executor:

=============  ===============================================================================
placeholder    meaning
=============  ===============================================================================
{config}       the job's TrainConfig (JSON file) as submitted: read by the resolve step alone
{config_file}  the config train reads: bound per node (the resolved config, or the search's best)
{model}        the job's model (`contracts.config.MODELS`); resolve refuses any other
{train_epochs} the job's length in epochs, which resolve turns into run.steps; 0: the config's run.steps
{pool}         the job's GPU pool, which resolve checks against {pools}
{pools}        the controller's pools file (YAML, `pools: [{name: …}]`)
{job_id}       the job's id (the trainer's metrics and progress carry it)
{commit}       the trainer's commit (its image tag on a cluster)
{run}          the job's output root (config.json, check/, hyperopt/, train/ below it), fixed per job
{checkpoints}  the job's checkpoint root, fixed per job (never per pod or retry): retries resume
{storage}      the Optuna storage URL of the job's study
{study}        the Optuna study name (one per job)
{trials}       hyper-parameter trials to run (the search runs only when > 0)
{pack}         one pack of trials, their numbers comma-separated ("0,1,2"; "3" alone): an item of the
               suggest step's JSON output (a fan-out item), trained in one pod
{status}       the pipeline's outcome, for the exit handler (Succeeded, Failed, Error)
{duration}     seconds the pipeline ran, for the exit handler
{failures}     the failed steps as JSON, for the exit handler
=============  ===============================================================================

The resolve step, first and on a CPU, checks what the job asks and writes its resolved config to
RESOLVED_CONFIG (`{run}/config.json`: model and pool checked, epochs turned into run.steps, the one
place that happens), and every later step reads that file, so the config is the one carrier of plan,
steps and seeds. It needs no GPU, so a job that asks for a pool nobody has fails at once instead of
waiting for a node of that pool; compile, the first GPU step, then runs the resolved config's plan.

Torch-free, and imports nothing of `trainer` or `service`: the controller imports it.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

Resources = Literal["gpu", "cpu", "tiny"]
Retry = Literal["infrastructure", "on-error"]

SUGGEST, TRIAL, BEST = "hyperopt-suggest", "hyperopt-trial", "hyperopt-best"
RESOLVE, CHECK, TRAIN, REPORT, EXIT, BENCH = "resolve", "compile", "train", "report", "on-exit", "bench"

RESOLVED_CONFIG = "{run}/config.json"
BEST_CONFIG = "{run}/hyperopt/best-config.json"
TRAIN_RUN_DIR = "{run}/train"
CHECKPOINT_ENV = "FOXHUNT_CHECKPOINT_URL"  # where a step's checkpoint location reaches the trainer's CLI
# What a GPU step's trainer tags its metrics and progress with.
JOB_ENV = (("FOXHUNT_JOB_ID", "{job_id}"), ("FOXHUNT_POOL", "{pool}"), ("FOXHUNT_COMMIT", "{commit}"))


class GraphError(ValueError):
    """A graph whose edges or fan-outs name nodes that do not come before them."""


def fields_of(text: str) -> set[str]:
    """The placeholder names in `text`."""
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


@dataclass(frozen=True)
class Step:
    """One trainer command and what it needs from the machine that runs it (one template on Argo)."""

    name: str
    argv: tuple[str, ...]  # trainer CLI arguments, with {placeholders}
    resources: Resources
    deadline_seconds: int
    # infrastructure: node loss, preemption and SIGTERM (exit 143) are retried, the trainer's own
    # failures (exit 1, 2) are not; on-error: only Argo's Error phase (the pod never ran to an exit).
    retry: Retry
    checkpoint: str | None = None  # the step's checkpoint location, fixed per job: a retry resumes from it
    env: tuple[tuple[str, str], ...] = ()  # environment the trainer reads, with {placeholders}
    optuna: bool = False
    description: str = ""

    def command(self, values: Mapping[str, str]) -> list[str]:
        """The argument list with every placeholder bound (KeyError names a missing one)."""
        return [part.format(**values) for part in self.argv]

    def environment(self, values: Mapping[str, str]) -> dict[str, str]:
        """The step's environment with every placeholder bound, its checkpoint location included."""
        env = {name: value.format(**values) for name, value in self.env}
        if self.checkpoint is not None:
            env[CHECKPOINT_ENV] = self.checkpoint.format(**values)
        return env

    def placeholders(self) -> set[str]:
        """Every placeholder the step uses: arguments, environment, checkpoint."""
        parts = [*self.argv, *(value for _, value in self.env), self.checkpoint or ""]
        return set().union(*(fields_of(part) for part in parts))


@dataclass(frozen=True)
class When:
    """A node runs only when the whole-number placeholder compares so with `value` (e.g. trials > 0)."""

    placeholder: str
    op: Literal[">", "=="]
    value: int

    def holds(self, values: Mapping[str, str]) -> bool:
        number = int(values[self.placeholder])
        return number > self.value if self.op == ">" else number == self.value


@dataclass(frozen=True)
class FanOut:
    """Run a node once per item of the JSON list that node `source` printed as its last stdout line,
    the item bound to placeholder `item`; with `tolerate_failures` a failed item does not fail the graph."""

    source: str
    item: str
    tolerate_failures: bool = True


@dataclass(frozen=True)
class Node:
    """One vertex: a step (or a sub-graph run as one unit), the nodes it comes after, and when it runs."""

    name: str
    run: Step | Graph
    after: tuple[str, ...] = ()
    when: When | None = None
    fan_out: FanOut | None = None
    bind: tuple[tuple[str, str], ...] = ()  # placeholders this node binds for its step, e.g. config_file

    def values(self, values: Mapping[str, str]) -> dict[str, str]:
        """`values` with this node's own bindings added (themselves bound by `values`)."""
        return {**values, **{name: value.format(**values) for name, value in self.bind}}


@dataclass(frozen=True)
class Graph:
    """Nodes in an order that respects their edges: each `after` and fan-out source names an earlier node."""

    name: str
    nodes: tuple[Node, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for node in self.nodes:
            if node.name in seen:
                raise GraphError(f"{self.name}: two nodes named {node.name!r}")
            needs = {*node.after, *([node.fan_out.source] if node.fan_out else [])}
            if needs - seen:
                raise GraphError(f"{self.name}: {node.name!r} comes after {sorted(needs - seen)}, not yet defined")
            seen.add(node.name)

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def with_node(self, node: Node) -> Graph:
        """This graph with `node` added at the end (its edges say where it runs)."""
        return dataclasses.replace(self, nodes=(*self.nodes, node))

    def layers(self) -> list[list[Node]]:
        """Nodes grouped by their longest path from a root: each group may run once the earlier ones ended."""
        depth: dict[str, int] = {}
        for node in self.nodes:
            depth[node.name] = 1 + max((depth[name] for name in node.after), default=-1)
        return [[n for n in self.nodes if depth[n.name] == level] for level in range(max(depth.values()) + 1)]

    def walk(self) -> Iterator[tuple[Graph, Node]]:
        """Every node with the graph that holds it, depth first, in order."""
        for node in self.nodes:
            yield self, node
            if isinstance(node.run, Graph):
                yield from node.run.walk()

    def graphs(self) -> list[Graph]:
        """This graph and every sub-graph, in order."""
        return [self, *(node.run for _, node in self.walk() if isinstance(node.run, Graph))]


@dataclass(frozen=True)
class Pipeline:
    """A job: its graph, then `on_exit` always (after success, failure or a stop)."""

    graph: Graph
    on_exit: Step

    def steps(self) -> list[Step]:
        """Every distinct step, in the graph's order, then on_exit (one template each on Argo)."""
        out: list[Step] = []
        for _, node in self.graph.walk():
            if isinstance(node.run, Step) and node.run not in out:
                out.append(node.run)
        return [*out, self.on_exit]

    def step(self, name: str) -> Step:
        return next(step for step in self.steps() if step.name == name)

    def env_names(self) -> set[str]:
        """Every environment variable some step of the pipeline sets."""
        return {name for step in self.steps() for name, _ in step.env} | {CHECKPOINT_ENV}

    def nodes_running(self, step: Step) -> list[Node]:
        """The nodes that run `step` (train runs as train, or as train-best after a search)."""
        return [node for _, node in self.graph.walk() if node.run == step]

    def node_inputs(self, step: Step) -> list[str]:
        """Placeholders of `step` that its nodes bind (fan-out items, per-node bindings), in a fixed order."""
        names: list[str] = []
        for node in self.nodes_running(step):
            for name in [*([node.fan_out.item] if node.fan_out else []), *(k for k, _ in node.bind)]:
                if name not in names:
                    names.append(name)
        return names


SEARCH = When("trials", ">", 0)
NO_SEARCH = When("trials", "==", 0)


def gpu_step(
    name: str, argv: tuple[str, ...], deadline_seconds: int, description: str, *, checkpoint: str | None = None,
    optuna: bool = False,
) -> Step:  # fmt: skip
    """A GPU step: the trainer's identity in its environment; retried on infrastructure failures only."""
    return Step(name, argv, "gpu", deadline_seconds, "infrastructure", checkpoint, JOB_ENV, optuna, description)


def cpu_step(
    name: str, argv: tuple[str, ...], resources: Resources, deadline_seconds: int, description: str, *,
    optuna: bool = False,
) -> Step:  # fmt: skip
    """A CPU step: retried only when its pod never ran to an exit (Argo's Error phase)."""
    return Step(name, argv, resources, deadline_seconds, "on-error", optuna=optuna, description=description)


RESOLVE_STEP = cpu_step(
    RESOLVE,
    (
        "resolve",
        *("--config", "{config}", "--model", "{model}", "--train-epochs", "{train_epochs}"),
        *("--pool", "{pool}", "--pools-file", "{pools}", "--out", RESOLVED_CONFIG),
    ),
    "tiny",
    300,
    "Checks what the job asks (the model, the pool, epochs or run.steps but not both) and writes its "
    "resolved config, which every later step reads. It needs no GPU: a job that asks wrongly, or for a "
    "pool the controller does not know, fails here at once with the reason, instead of waiting for a node.",
)
CHECK_STEP = gpu_step(
    CHECK,
    ("check", "--config", RESOLVED_CONFIG, "--out", "{run}/check"),
    3600,
    "A few updates of the resolved config's plan on this machine's device: warm-up, capture, graphs. A plan "
    "that cannot run fails here in minutes instead of hours into train; on a cluster it also warms the "
    "kernel caches that trials and train reuse.",
)
SUGGEST_STEP = cpu_step(
    SUGGEST,
    (
        *("hyperopt", "suggest", "--config", RESOLVED_CONFIG, "--trials", "{trials}"),
        *("--storage", "{storage}", "--study", "{study}"),
    ),
    "cpu",
    600,
    "Creates the study, asks the trials and groups them into packs (trials whose configs differ only in the "
    "seed and numeric hyper-parameters, up to 16 a pack; a searched shape or switch runs its trials one per pod, "
    "and the log says so); prints the packs as a JSON list on stdout, one trial pod each.",
    optuna=True,
)
TRIAL_STEP = gpu_step(
    TRIAL,
    (
        *("hyperopt", "trial", "--trials", "{pack}", "--storage", "{storage}", "--study", "{study}"),
        *("--config", RESOLVED_CONFIG, "--run-dir", "{run}/hyperopt"),
    ),
    21600,
    "Trains one pack of trials (one process, one batched step) with their stored parameters, each into "
    "hyperopt/trial-<n>, and tells the study each trial's objective; a diverged run fails its trial alone.",
    checkpoint="{checkpoints}",  # trial n's: {checkpoints}/trial-<n>, fixed per job
    optuna=True,
)
BEST_STEP = cpu_step(
    BEST,
    (
        *("hyperopt", "best", "--storage", "{storage}", "--study", "{study}"),
        *("--config", RESOLVED_CONFIG, "--out", BEST_CONFIG),
    ),
    "cpu",
    600,
    "Writes the base config with the best completed trial's parameters, for train.",
    optuna=True,
)
# `--resume` continues from the job's checkpoint, so a retry after node loss or preemption picks up
# where the last checkpoint left off. Its config is the node's: the resolved one, or the search's best.
TRAIN_STEP = gpu_step(
    TRAIN,
    ("train", "--config", "{config_file}", "--run-dir", TRAIN_RUN_DIR, "--resume", "--no-progress"),
    172800,
    "The full training run.",
    checkpoint="{checkpoints}/train",
)
REPORT_STEP = cpu_step(
    REPORT,
    ("report", "--run-dir", TRAIN_RUN_DIR),
    "tiny",
    300,
    "Prints the run's breakdown, then its summary as one JSON line: the step's result.",
)
EXIT_STEP = cpu_step(
    EXIT,
    ("finish", "--run", "{run}", "--status", "{status}", "--duration", "{duration}", "--failures", "{failures}"),
    "tiny",
    300,
    "Runs on success, failure and stop: writes status.json beside the run, outliving the job.",
)
# Not part of a job: the benchmark operators and the nightly CronWorkflow run on one GPU of a pool.
BENCH_STEP = Step(
    name=BENCH,
    argv=("bench", "--device", "cuda", "--out", "{out}"),
    resources="gpu",
    deadline_seconds=5400,
    retry="infrastructure",
    env=(("FOXHUNT_POOL", "{pool}"), ("FOXHUNT_COMMIT", "{commit}")),
    description="Every plan timed on one GPU of the pool; bench.json on the volume, the table to the Pushgateway.",
)

# The search: suggest prints the packs of trials, one trial pod per pack (a crashed trial is recorded as
# failed in the study and the search goes on without it), then the best trial's config.
HYPEROPT = Graph(
    "hyperopt",
    (
        Node("suggest", SUGGEST_STEP),
        Node("trial", TRIAL_STEP, after=("suggest",), fan_out=FanOut(source="suggest", item="pack")),
        Node("best", BEST_STEP, after=("trial",)),
    ),
)
PIPELINE = Pipeline(
    graph=Graph(
        "main",
        (
            Node("resolve", RESOLVE_STEP),
            Node("compile", CHECK_STEP, after=("resolve",)),
            Node("hyperopt", HYPEROPT, after=("compile",), when=SEARCH),
            Node(
                "train",
                TRAIN_STEP,
                after=("compile", "hyperopt"),
                when=NO_SEARCH,
                bind=(("config_file", RESOLVED_CONFIG),),
            ),
            Node("train-best", TRAIN_STEP, after=("hyperopt",), when=SEARCH, bind=(("config_file", BEST_CONFIG),)),
            Node("report", REPORT_STEP, after=("train", "train-best")),
        ),
    ),
    on_exit=EXIT_STEP,
)
