# The trainer's base built with no registry of images (scripts/images.sh): the Python stand-in plus torch
# from a wheel in the build context, in a venv first on PATH, as the public PyTorch image has its Python
# with pip and torch first on PATH. The Dockerfile's trainer target installs the rest of the `trainer`
# group on top; this torch satisfies its range, so pip keeps it.
#
# From PyPI, torch 2.13.0 for Linux is the CUDA 13 build, and its dependencies (resolved from the index
# here) are the nvidia-* wheels (cuBLAS, cuDNN, NCCL, cuSPARSELt, ...) and triton: about 2.1 GB to
# download next to the 0.5 GB wheel, 5 GB in this layer. They stay, deliberately: torch's own libraries
# link them (libtorch_cuda.so lists libcudart, libcublas, libcudnn, libnccl and the rest as NEEDED, and
# `import torch` preloads them), so without them torch does not import even on a CPU; and with them this
# stand-in holds the same kind of torch as the public pytorch/pytorch image (CUDA, triton), which is
# what the trainer target is written for. With no GPU torch runs on the CPU (cuda.is_available() is
# False). Where pip's find-links hold a CPU wheel (2.13.0+cpu), scripts/images.sh brings that one and
# pip takes no nvidia-* wheels.
ARG PYTHON_IMAGE
FROM ${PYTHON_IMAGE}
# The wheel (the context's one file) is bind-mounted, so it never lands in a layer. It is named by its
# path: asked for `torch==<version>` with /wheels as find-links, pip takes the index's copy of the same
# file and downloads it again. torch's own dependencies come from the index.
RUN --mount=type=bind,target=/wheels \
    python -m venv /opt/python \
    && /opt/python/bin/pip install --no-cache-dir /wheels/torch-*.whl
ENV PATH=/opt/python/bin:$PATH
