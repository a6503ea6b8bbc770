# The trainer's base built with no registry of images (scripts/images.sh): the Python stand-in plus the
# CPU build of torch from a wheel in the build context, in a venv first on PATH, as the public PyTorch
# image has its Python with pip and torch first on PATH. The Dockerfile's trainer target installs the
# rest of the `trainer` group on top; this torch satisfies its range, so pip keeps it.
ARG PYTHON_IMAGE
FROM ${PYTHON_IMAGE}
ARG TORCH_VERSION=2.13.0+cpu
# The wheel is bind-mounted, so it never lands in a layer; torch's own dependencies come from the index.
RUN --mount=type=bind,target=/wheels \
    python -m venv /opt/python \
    && /opt/python/bin/pip install --no-cache-dir --find-links /wheels "torch==${TORCH_VERSION}"
ENV PATH=/opt/python/bin:$PATH
