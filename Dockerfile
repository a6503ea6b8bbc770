# Two images from one file:
#   docker build --target service -t foxhunt-service:$(git rev-parse HEAD) .
#   docker build --target trainer -t foxhunt-trainer:$(git rev-parse HEAD) .
# The Argo templates pull the trainer by commit sha, so tag it with the full sha.
# BuildKit is needed (RUN --mount; the default builder since Docker 23, DOCKER_BUILDKIT=1 before). No
# `# syntax=` line: the builder's own Dockerfile frontend is enough, so nothing is pulled but the bases.
#
# The two base images are build arguments. Their defaults are the public images, pinned by exact tag
# (Python 3.11.13 on Debian bookworm; PyTorch 2.11.0 with CUDA 12.8 and cuDNN 9); pin by digest in
# your registry mirror if you need immutability. Any base works that has, on PATH, a Python 3.11 with
# `python -m venv` (PYTHON_IMAGE), or with pip and a torch the `trainer` group accepts (PYTORCH_IMAGE);
# both need bash, apt-get and groupadd/useradd. scripts/images.sh builds such bases with no registry of
# images at all (Debian bookworm from debootstrap, CPU torch) and then both targets; see docs/deploy.md.
# checkov:skip=CKV_DOCKER_7: the base images are build arguments whose defaults pin exact version tags, checked by tests/deploy/test_dockerfile.py
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
ARG PYTORCH_IMAGE=pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime

# ---------------------------------------------------------------- service: build a venv
FROM ${PYTHON_IMAGE} AS service-build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# The source is bind-mounted (read-write, discarded), so it never lands in a layer.
# The controller installs the `service` group only: no torch in this image. Exact versions come from
# the lock (hashes checked); then the project itself, offline, from what the lock installed.
RUN --mount=type=bind,target=/src,rw \
    pip install --no-cache-dir --require-hashes -r requirements/service.txt \
    && pip install --no-cache-dir --no-index --no-build-isolation "./[service]"

# ---------------------------------------------------------------- service: runtime
FROM ${PYTHON_IMAGE} AS service
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="foxhunt-service" \
      org.opencontainers.image.description="foxhunt job controller (FastAPI): turns training jobs into Argo Workflows" \
      org.opencontainers.image.source="https://github.com/foxhunt/foxhunt" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
RUN groupadd --gid 10001 foxhunt \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin foxhunt
COPY --from=service-build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FOXHUNT_BACKEND=argo
WORKDIR /tmp
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
ENTRYPOINT ["foxhunt"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]

# ---------------------------------------------------------------- trainer
FROM ${PYTORCH_IMAGE} AS trainer
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="foxhunt-trainer" \
      org.opencontainers.image.description="foxhunt GPU trainer (CUDA graphs, Triton kernels) for distributional DQN" \
      org.opencontainers.image.source="https://github.com/foxhunt/foxhunt" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Triton builds its small C launcher at run time with the system C compiler; the runtime
# base image has none. DL3008 (pin apt versions) is ignored: the base image is pinned by exact
# tag, and Ubuntu drops superseded package versions from its mirrors, so a pin breaks rebuilds.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Exact versions from the lock (hashes checked), then the project itself, offline. torch is not in the
# lock (scripts/lock.py says why): it comes from the base image, and the offline install fails unless
# that torch satisfies the `trainer` group's range.
RUN --mount=type=bind,target=/src,rw \
    pip install --no-cache-dir --require-hashes -r requirements/trainer.txt \
    && pip install --no-cache-dir --no-index --no-build-isolation "./[trainer]"
RUN groupadd --gid 10001 foxhunt \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/foxhunt --shell /bin/bash foxhunt \
    && mkdir -p /cache /runs \
    && chown foxhunt:foxhunt /cache /runs
# Kernel caches live on the volume the compile step warms and the train step reuses.
ENV PYTHONUNBUFFERED=1 \
    TORCHINDUCTOR_CACHE_DIR=/cache/inductor \
    TRITON_CACHE_DIR=/cache/triton \
    FOXHUNT_METRICS_PORT=9400
WORKDIR /runs
USER 10001:10001
EXPOSE 9400
ENTRYPOINT ["python", "-m", "trainer"]
CMD ["--help"]
