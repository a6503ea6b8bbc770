"""Dockerfile: hadolint-clean, pinned, non-root, and each target installs exactly its dependency group."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.deploy.conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile"
TARGETS = {"service": "service", "trainer": "trainer"}


def _instructions() -> list[tuple[str, str, str]]:
    """(stage, INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out, stage, pending = [], "", ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        pending += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        keyword, _, args = pending.partition(" ")
        if keyword.upper() == "FROM":
            stage = args.split(" AS ")[-1].strip() if " AS " in args else args
        out.append((stage, keyword.upper(), args.strip()))
        pending = ""
    return out


def _pip_installs(stage: str) -> list[list[str]]:
    commands = []
    for found_stage, keyword, args in _instructions():
        if found_stage == stage and keyword == "RUN":
            for command in re.split(r"&&|;", re.sub(r"--mount=\S+", "", args)):
                words = shlex.split(command)
                if words[:2] == ["pip", "install"]:
                    commands.append(words[2:])
    return commands


@pytest.mark.parametrize(
    "dockerfile", [DOCKERFILE, ROOT / "scripts" / "images" / "pytorch.Dockerfile"], ids=lambda path: path.name
)
def test_hadolint_passes(dockerfile: Path) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run([str(hadolint), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_ignored_rule_is_explained_in_place() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    for number, line in enumerate(lines):
        match = re.match(r"#\s*hadolint ignore=(\S+)", line.strip())
        if match:
            above = " ".join(lines[max(0, number - 3) : number])
            for rule in match.group(1).split(","):
                assert rule in above, f"line {number + 1}: ignored {rule} is not explained just above"


def _global_args() -> dict[str, str]:
    """The build arguments declared before the first FROM, with their defaults."""
    return dict(a.split("=", 1) for s, k, a in _instructions() if s == "" and k == "ARG" and "=" in a)


def test_base_images_are_build_arguments_whose_defaults_are_pinned() -> None:
    """Stand-ins (scripts/images.sh) replace the bases; a plain `docker build` gets the pinned public images."""
    defaults = _global_args()
    for stage, keyword, args in _instructions():
        if keyword == "FROM":
            image = args.split()[0]
            match = re.fullmatch(r"\$\{(\w+)\}", image)
            assert match and match[1] in defaults, f"stage {stage}: base {image} is not a build argument"
            default = defaults[match[1]]
            assert re.search(r"(@sha256:[0-9a-f]{64}|:\d+\.\d+\.\d+[-\w.]*)$", default), f"{default} is not pinned"
    assert defaults["PYTHON_IMAGE"].startswith("python:3.11.")
    assert defaults["PYTORCH_IMAGE"].startswith("pytorch/pytorch:2.11.0-cuda12.8")


def test_targets_exist_and_run_as_non_root() -> None:
    instructions = _instructions()
    for target in TARGETS:
        users = [args for stage, keyword, args in instructions if stage == target and keyword == "USER"]
        assert users and users[-1].split(":")[0] not in ("0", "root"), f"{target} runs as root"
        labels = " ".join(args for stage, keyword, args in instructions if stage == target and keyword == "LABEL")
        for key in ("title", "source", "revision", "version", "licenses"):
            assert f"org.opencontainers.image.{key}=" in labels, f"{target}: OCI label {key} missing"
    assert any(s == "service" and k == "HEALTHCHECK" and "/healthz" in a for s, k, a in instructions)
    # The service's runtime stage copies only the built venv from its build stage.
    copies = [a for s, k, a in instructions if s == "service" and k == "COPY"]
    assert copies == ["--from=service-build /opt/venv /opt/venv"]


def _declared_extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _requirement_name(spec: str) -> str:
    return re.split(r"[<>=!~\[;@ ]", spec, maxsplit=1)[0].lower().replace("_", "-")


@pytest.mark.parametrize(("target", "group"), [("service-build", "service"), ("trainer", "trainer")])
def test_each_target_installs_exactly_its_dependency_group_from_its_lock(target: str, group: str) -> None:
    """First the group's lock with hashes checked, then the project's group offline: nothing unpinned."""
    assert group in _declared_extras()
    installs = _pip_installs(target)
    assert len(installs) == 2, f"{target}: expected the lock's install, then the project's, got {installs}"
    locked, project = installs
    assert locked == ["--no-cache-dir", "--require-hashes", "-r", f"requirements/{group}.txt"], locked
    assert {"--no-index", "--no-build-isolation"} <= set(project), project
    packages = [w for w in project if not w.startswith("-")]
    assert packages == [f"./[{group}]"], f"{target} installs {packages}, not the package's [{group}] group"
    allowed = (ROOT / ".dockerignore").read_text().splitlines()
    assert f"!requirements/{group}.txt" in allowed, f"requirements/{group}.txt is not in the build context"
