#!/usr/bin/env bash
# Builds foxhunt-service and foxhunt-trainer with no registry of images, from local stand-ins for the
# Dockerfile's two base images (`make images`; tests/deploy/test_images.py runs it in CI):
#   PYTHON_IMAGE   Debian bookworm from `debootstrap --variant=minbase` with Debian's Python 3.11, venv
#                  and passwd, `docker import`ed (what python:3.11-slim-bookworm gives the Dockerfile);
#   PYTORCH_IMAGE  that image plus torch (TORCH_VERSION) as this machine's pip finds it, in a venv first
#                  on PATH (scripts/images/pytorch.Dockerfile; what pytorch/pytorch gives it). From PyPI
#                  that is the CUDA build with its nvidia-* and triton wheels (about 2.6 GB to download,
#                  5 GB installed): it imports and trains on a CPU, and it cannot drop those wheels, as
#                  the Dockerfile there says. A local CPU wheel (2.13.0+cpu in pip's find-links) wins
#                  where there is one: `==2.13.0` matches it, and pip ranks it above the plain release.
# Then both targets, built against them. Python packages come from the package index pip is configured
# with, Debian packages from Debian's mirror: nothing is pulled from a registry of images. A stand-in
# already present is reused (`--rebuild-bases` makes both again).
#
# Needs root (debootstrap, chroot), debootstrap, and a BuildKit-capable docker client and engine
# (`DOCKER=/usr/bin/docker` picks Debian's docker.io client; DOCKER_HOST picks the engine).
# Every build runs with `--network host`: no bridge network is needed or made.
#
# Environment (all optional):
#   TAG            image tag of both targets (default: the commit, `git rev-parse HEAD`)
#   DOCKER         docker client (default: docker)
#   PYTHON_BASE    tag of the Python stand-in (default: foxhunt-base/python:3.11-bookworm)
#   PYTORCH_BASE   tag of the PyTorch stand-in (default: foxhunt-base/pytorch:2.13.0-cpu)
#   TORCH_VERSION  torch release for the PyTorch stand-in (default: 2.13.0, a version pip resolves)
#   DEBIAN_MIRROR  Debian mirror for debootstrap (default: debootstrap's own)
#
# Prints each phase's seconds and each image's size; `make images` passes nothing.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DOCKER="${DOCKER:-docker}"
TAG="${TAG:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo dev)}"
PYTHON_BASE="${PYTHON_BASE:-foxhunt-base/python:3.11-bookworm}"
PYTORCH_BASE="${PYTORCH_BASE:-foxhunt-base/pytorch:2.13.0-cpu}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTHON_PACKAGES="python3,python3-venv,python-is-python3,passwd,ca-certificates"
export DOCKER_BUILDKIT=1

rebuild_bases=0
case "${1:-}" in
  --rebuild-bases) rebuild_bases=1 ;;
  "") ;;
  *) echo "usage: $0 [--rebuild-bases]" >&2; exit 2 ;;
esac

work="$(mktemp -d "${TMPDIR:-/tmp}/foxhunt-images.XXXXXX")"
trap 'rm -rf "$work"' EXIT

phase() {  # phase NAME COMMAND...: runs COMMAND, then prints how long it took
  local name="$1" start=$SECONDS
  shift
  "$@"
  echo "images: ${name} took $((SECONDS - start)) s"
}

have_image() {
  [[ $rebuild_bases -eq 0 ]] && "$DOCKER" image inspect "$1" >/dev/null 2>&1
}

python_base() {
  local rootfs="$work/rootfs"
  # shellcheck disable=SC2086  # DEBIAN_MIRROR is one optional word
  debootstrap --variant=minbase --include="$PYTHON_PACKAGES" bookworm "$rootfs" ${DEBIAN_MIRROR:-} >"$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; return 1; }
  # The CAs this machine added to its own store (a company's, a TLS-inspecting proxy's), so that pip and
  # apt-get inside the builds trust what the host trusts; pip is told to use the system store.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
  fi
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"
  # Slim: no package cache, lists, docs or translations (python:*-slim drops the same).
  rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* \
    "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* "$rootfs"/var/log/*
  tar --numeric-owner -C "$rootfs" -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$PYTHON_BASE" >/dev/null
}

pytorch_base() {
  local context="$work/torch"
  mkdir -p "$context"
  # The wheel as this machine's pip finds it (its find-links, its index), for the stand-in's Python 3.11
  # and without torch's dependencies: those are installed from the index inside the build (for PyPI's
  # CUDA build, its nvidia-* and triton wheels: scripts/images/pytorch.Dockerfile says why they stay).
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 --dest "$context" \
    "torch==${TORCH_VERSION}"
  "$DOCKER" build --quiet --network host --build-arg PYTHON_IMAGE="$PYTHON_BASE" \
    -f "$ROOT/scripts/images/pytorch.Dockerfile" -t "$PYTORCH_BASE" "$context" >/dev/null
}

target() {  # target NAME: foxhunt-NAME:TAG from the Dockerfile's NAME target, on the stand-ins
  "$DOCKER" build --quiet --network host --target "$1" \
    --build-arg PYTHON_IMAGE="$PYTHON_BASE" --build-arg PYTORCH_IMAGE="$PYTORCH_BASE" \
    --build-arg REVISION="$TAG" -t "foxhunt-$1:$TAG" "$ROOT" >/dev/null
}

have_image "$PYTHON_BASE" && echo "images: $PYTHON_BASE present" || phase "$PYTHON_BASE" python_base
have_image "$PYTORCH_BASE" && echo "images: $PYTORCH_BASE present" || phase "$PYTORCH_BASE" pytorch_base
phase "foxhunt-service:$TAG" target service
phase "foxhunt-trainer:$TAG" target trainer
for image in "$PYTHON_BASE" "$PYTORCH_BASE" "foxhunt-service:$TAG" "foxhunt-trainer:$TAG"; do
  echo "images: $image size $(($("$DOCKER" image inspect --format '{{.Size}}' "$image") / 1000000)) MB"
done
