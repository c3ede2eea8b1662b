# The nalu-sweep image: this package on a CUDA PyTorch base. One image serves the Ray head,
# the Ray workers, the MLflow server and the optional optuna-dashboard (docker-compose.yml).
#
#   docker build -t nalu-sweep .
#   docker build --build-arg BASE_IMAGE=pytorch/pytorch:<tag> -t nalu-sweep .   # another CUDA
#
# The base's torch is kept: pip sees the requirement satisfied and does not replace it. So
# the base's torch must lie in pyproject.toml's range (torch 2.13.x, the release CI tests;
# tests/cluster/test_compose.py checks the default): a base outside it gets its torch
# replaced by PyPI's build of the allowed release.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RAY_USAGE_STATS_ENABLED=0

# curl: healthchecks; tini: a real init (Ray and MLflow spawn many children)
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl tini \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/nalu-sweep
# dependencies first (cached while only the code changes)
COPY pyproject.toml README.md ./
RUN mkdir -p service && touch service/__init__.py \
    && pip install ".[server,dashboard]" "ray[default,client]==2.60.*" \
    && pip uninstall -y nalu-sweep
COPY service ./service
COPY search_spaces ./search_spaces
COPY deploy ./deploy
COPY dashboards ./dashboards
RUN pip install --no-deps . \
    && chmod 0755 deploy/mlflow/start-mlflow.sh \
    && (id -u nalu >/dev/null 2>&1 || useradd --create-home nalu) \
    && mkdir -p /shared/runs /mlflow/artifacts /tmp/ray \
    && chown -R nalu:nalu /shared /mlflow /tmp/ray

USER nalu
WORKDIR /home/nalu
ENTRYPOINT ["tini", "--"]
CMD ["nalu-sweep", "--help"]
