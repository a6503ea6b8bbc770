"""The job pipeline as a graph: its edges are checked, its layers are what Argo runs in parallel groups,
and a step added to the graph is run by both executors (the Argo renderer and the local backend)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from argo import render
from contracts.pipeline import (
    PIPELINE,
    REPORT_STEP,
    TRAIN_RUN_DIR,
    FanOut,
    Graph,
    GraphError,
    Node,
    Pipeline,
    Step,
    When,
)
from service.backends.local_pipeline import Outcome, PipelineRun
from tests.service.factories import POOLS_YAML, stand_in_command

# A step a project might add: an evaluation of the trained run after train, before report.
EVALUATE = Step(
    name="evaluate",
    argv=("report", "--run-dir", TRAIN_RUN_DIR),
    resources="tiny",
    deadline_seconds=300,
    retry="on-error",
    description="Evaluates the trained run.",
)


def with_evaluate(pipeline: Pipeline) -> Pipeline:
    """A copy of `pipeline` with EVALUATE after train (either call) and report after it."""
    nodes = [node for node in pipeline.graph.nodes if node.name != "report"]
    graph = Graph(
        pipeline.graph.name,
        (
            *nodes,
            Node("evaluate", EVALUATE, after=("train", "train-best")),
            Node("report", REPORT_STEP, after=("evaluate",)),
        ),
    )
    return Pipeline(graph=graph, on_exit=pipeline.on_exit)


def test_an_edge_to_a_node_not_yet_defined_is_refused() -> None:
    with pytest.raises(GraphError, match="comes after"):
        Graph("g", (Node("a", EVALUATE, after=("b",)), Node("b", EVALUATE)))
    with pytest.raises(GraphError, match="comes after"):
        Graph("g", (Node("a", EVALUATE, fan_out=FanOut(source="a", item="trial")),))
    with pytest.raises(GraphError, match="two nodes"):
        Graph("g", (Node("a", EVALUATE), Node("a", EVALUATE)))


def test_layers_follow_the_longest_path_so_train_waits_for_the_search() -> None:
    layers = [[node.name for node in layer] for layer in PIPELINE.graph.layers()]
    assert layers == [["resolve"], ["compile"], ["hyperopt"], ["train", "train-best"], ["report"]]


def test_conditions_pick_train_or_the_search_by_trials() -> None:
    graph = PIPELINE.graph
    assert graph.node("hyperopt").when == When("trials", ">", 0)
    for trials, runs in (("0", {"train"}), ("2", {"hyperopt", "train-best"})):
        conditional = {n.name for n in graph.nodes if n.when is not None and n.when.holds({"trials": trials})}
        assert conditional == runs


def test_an_added_step_is_rendered_by_argo_and_run_by_the_local_backend(tmp_path: Path) -> None:
    pipeline = with_evaluate(PIPELINE)

    workflow = render.compile_and_train(pipeline).to_dict()
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    main = [step["name"] for group in templates["main"]["steps"] for step in group]
    assert main.index("evaluate") == main.index("train-best") + 1 and main[-1] == "report"
    assert templates["evaluate"]["container"]["args"] == [
        "report",
        "--run-dir",
        "/data/runs/{{workflow.parameters.job-id}}/train",
    ]
    assert "evaluate" not in {t["name"] for t in render.compile_and_train(PIPELINE).to_dict()["spec"]["templates"]}

    (tmp_path / "config.json").write_text(json.dumps({"run": {"steps": 3}}))
    (tmp_path / "pools.yaml").write_text(POOLS_YAML)
    job = {"job_id": "job-1", "pool": "cpu", "model": "dqn", "commit_sha": "abc", "attempt": 0, "hyperopt_trials": 0}
    with open(tmp_path / "log.txt", "a") as log:
        outcome = PipelineRun(tmp_path, job, stand_in_command(), out=log, pipeline=pipeline).run()
    text = (tmp_path / "log.txt").read_text()
    assert outcome == Outcome(0), text
    started = [
        line.split(" starting: ")[0].removeprefix("--- foxhunt: step ")
        for line in text.splitlines()
        if " starting: " in line
    ]
    assert started == ["resolve", "compile", "train", "evaluate", "report", "on-exit"]
