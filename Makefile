# Two commands set everything up on a fresh machine: `make run` and `make test` (see README.md).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run train test lint lock dashboards dashboards-png argo

setup: $(STAMP)

# Exact versions from the lock (requirements/dev.txt, hashes checked), then the project itself, offline
# and without build isolation: that second install fails if the lock lacks anything pyproject.toml asks for.
# torch is not in the lock (scripts/lock.py says why): PyPI's torch 2.13.0 (its Linux build is the CUDA
# one, about 3 GB with its nvidia-* wheels; it runs on a CPU) is installed unless the venv has a torch;
# its own dependencies (triton, sympy and networkx among them) are the only unpinned packages.
$(STAMP): pyproject.toml requirements/dev.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q pip==26.3
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --require-hashes -r requirements/dev.txt
	$(PY) -m pip install -q --no-index --no-build-isolation -e ".[trainer,service,plots,dev]"
	$(PY) -m pip check
	touch $(STAMP)

# requirements/{dev,service,trainer}.txt from pyproject.toml (scripts/lock.py; needs the package index). It needs
# only uv, from the committed lock, not `setup`: after a dependency is added to pyproject.toml the project does not
# install (offline, from the lock) until the lock has it.
lock: $(VENV)/bin/uv
	$(PY) scripts/lock.py

$(VENV)/bin/uv:
	python3 -m venv $(VENV)
	$(PY) -m pip install -q pip==26.3
	$(PY) -m pip install -q --require-hashes -r requirements/dev.txt

# The main job on the embedded default: a short training run, printing its step breakdown.
run: setup
	$(PY) -m service quickstart --config examples/quickstart.yaml --workdir runs/quickstart

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

# One pytest-xdist worker per core. loadgroup keeps the tests of a module marked xdist_group on one
# worker (the Prometheus stack, checkov), so each expensive fixture starts once; the rest balance freely.
test: setup lint
	$(PY) -m pytest -n auto --dist loadgroup

# k8s/components/monitoring/dashboards/*.json from their definitions in scripts/dashboards.py
# (tests/k8s/test_dashboards.py fails when the committed JSON differs from what the code renders).
dashboards: setup
	$(PY) scripts/dashboards.py

# argo/*.yaml from the job pipeline (contracts/pipeline.py) by argo/render.py with Hera
# (tests/argo/test_render.py fails when the committed YAML differs from what the code renders).
argo: setup
	$(PY) -m argo.render

# docs/dashboards.png: every panel plotted from its own queries against a real Prometheus scraping
# CPU trainers (about 3 minutes: the stack starts, then gathers 90 s of data).
dashboards-png: setup
	$(PY) -m tests.k8s.render_dashboards docs/dashboards.png --seconds 90

# Both images with no registry of images: local stand-ins for the two base images (Debian from
# debootstrap, PyPI's torch 2.13.0), then both targets (scripts/images.sh; root, debootstrap and a
# running Docker engine; docs/deploy.md has an operator's commands with the public bases).
.PHONY: images test-images
images:
	scripts/images.sh

# The images test (pytest marker `images`, off in `make test`; CI runs it after the suite): a Docker
# engine of its own builds both images with scripts/images.sh and runs them as the manifests do.
test-images: setup
	$(PY) -m pytest -m images

# The cluster tests (pytest marker `cluster`, off in `make test`; CI runs them after the images test):
# a single-node Kubernetes and Argo's workflow-controller built from upstream sources and started by
# scripts/cluster.sh (cached by version under /var/cache/foxhunt-cluster; Go from /usr/local/go), with
# kwok's fake nodes; our manifests applied; the controller and `compile-and-train` run end to end.
.PHONY: test-cluster
test-cluster: setup
	PATH="/usr/local/go/bin:$$PATH" scripts/cluster.sh up
	$(PY) -m pytest -m cluster
