# syntax=docker/dockerfile:1
# One image for the API, the workers, beat and flower. CPU torch by default; for GPU workers
# build with the CUDA wheel index, e.g.
#   docker compose --profile gpu build   (worker-gpu passes TORCH_INDEX_URL=.../whl/cu130)
# The torch installed here is the "current" build; builds under test get their own cached venvs
# at run time (workers/builds/torch_envs.py), under NIGHTBENCH_ENV_CACHE_DIR.
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim-bookworm

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    NIGHTBENCH_DATA_DIR=/var/lib/nightbench \
    NIGHTBENCH_ENV_CACHE_DIR=/var/cache/nightbench/envs

# git: commit ranges and bisection checkouts; build tools for probes built from source;
# jemalloc: the allocator every benchmark process preloads (suite/cpu_setup.py); valgrind: the
# count pass of CPU nights (cpu_instructions, suite/counting.py).
RUN apt-get update \
    && apt-get install -y --no-install-recommends git build-essential libjemalloc2 valgrind \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --gid 10001 nightbench \
    && useradd --uid 10001 --gid nightbench --create-home --shell /usr/sbin/nologin nightbench \
    && mkdir -p /app /var/lib/nightbench /var/cache/nightbench/envs \
    && chown -R nightbench:nightbench /var/lib/nightbench /var/cache/nightbench

WORKDIR /app

# torch first, in its own layer: it is the largest and changes least often. Only this step sees
# the torch index, so no other package can come from it by name.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

# Dependencies before the source, so code edits do not reinstall them.
COPY pyproject.toml README.md ./
RUN mkdir -p service workers suite migrations \
    && touch service/__init__.py workers/__init__.py suite/__init__.py migrations/__init__.py \
    && pip install -e . "flower>=2.0" \
    && rm -rf service workers suite migrations nightbench.egg-info

COPY alembic.ini ./
COPY migrations ./migrations
COPY service ./service
COPY suite ./suite
COPY workers ./workers
# Editable, so /app is the suite's root: workers link a venv's suite to /app/suite.
RUN pip install --no-deps -e . && python -c "import service, suite, workers"

# Optional: TorchBench's models (docs/deployment.md). With TORCHBENCH_COMMIT set (pin a commit:
# pytorch/benchmark's main moves), the image holds pytorch/benchmark at that commit in
# /opt/torchbench, and `nightbench torchbench install` installs the requirements of
# TORCHBENCH_MODELS (comma-separated torchbench.<name> or patterns; empty: every model) with
# TorchBench's own install.py: first the torchvision and torchaudio builds of this torch, from
# the same index (TORCH_INDEX_URL), checked by import; then each model held to what was
# installed before it. Its import checks are kept in the image (NIGHTBENCH_TORCHBENCH_CACHE),
# so the listing knows at once which models are available. Exit 1 names the models whose setup
# FAILED or that do not import (input data or configs behind a host the build cannot reach):
# the image is still built, and the listing marks those unavailable with the reason. Exit 2
# (no torchvision/torchaudio for this torch on that index) fails the build.
ARG TORCHBENCH_COMMIT=
ARG TORCHBENCH_MODELS=
ENV NIGHTBENCH_TORCHBENCH_CACHE=/var/cache/nightbench/torchbench-imports
RUN if [ -n "${TORCHBENCH_COMMIT}" ]; then \
        set -e; \
        git init -q /opt/torchbench; \
        git -C /opt/torchbench fetch -q --depth 1 https://github.com/pytorch/benchmark "${TORCHBENCH_COMMIT}"; \
        git -C /opt/torchbench checkout -q FETCH_HEAD; \
        rc=0; \
        nightbench torchbench install --torchbench /opt/torchbench --torch-index "${TORCH_INDEX_URL}" \
            ${TORCHBENCH_MODELS:+--models "${TORCHBENCH_MODELS}"} || rc=$?; \
        if [ "$rc" -eq 1 ]; then \
            echo "TorchBench: the models named above are unavailable in this image"; \
        elif [ "$rc" -ne 0 ]; then \
            exit "$rc"; \
        fi; \
        chown -R nightbench:nightbench /var/cache/nightbench; \
    fi

USER nightbench
EXPOSE 8000 5555
CMD ["nightbench", "--help"]
