# Cascade's Python images, one Dockerfile, two targets:
#   docker build --target gateway -t cascade-gateway:0.1.0 .   # the gateway (default target)
#   docker build --target jobs    -t cascade-jobs:0.1.0 .      # train, retrain, materialize,
#                                                              # rollout, and cascade-loop
# Base: the official CPython 3.11 image on Debian 12 (bookworm), pinned to the patch release:
# the same Python minor and Debian release the project is tested on (requires-python >= 3.11;
# docker-library/python's 3.11/slim-bookworm builds CPython 3.11.15 FROM debian:bookworm-slim).
# Dependencies install before the code (constraints.txt pins every version; torch is the CPU
# build from PyTorch's CPU wheel index), so a code change rebuilds only the last layers.
# Both run as the unprivileged user 10001 (numeric, so Kubernetes' runAsNonRoot can check it).
ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
RUN groupadd --system --gid 10001 cascade \
 && useradd --system --uid 10001 --gid cascade --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin cascade \
 && python -m venv /opt/venv \
 && pip install setuptools==80.9.0 \
 && install -d -o 10001 -g 10001 /artifacts
WORKDIR /app
COPY pyproject.toml constraints.txt ./
# The core dependencies and those of each extra, read from pyproject.toml, install (pinned by
# constraints.txt) before the code is copied.
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
extra = p['optional-dependencies']; \
open('serve.txt', 'w').write('\n'.join(p['dependencies'] + extra['serve'])); \
open('train.txt', 'w').write('\n'.join(extra['train']))"

FROM base AS serve-deps
RUN pip install -c constraints.txt -r serve.txt

FROM serve-deps AS train-deps
RUN pip install -c constraints.txt -r train.txt

# The jobs: the offline pipeline and `cascade materialize` (which needs the serving side too).
FROM train-deps AS jobs
# MovieLens-100K, the built-in data set, comes as the files of this wheel (a data carrier,
# never imported: pipelines/data/movielens.py), as the README's install does
RUN pip install --no-deps recbole==1.2.1
COPY README.md ./
COPY core ./core
COPY pipelines ./pipelines
COPY services ./services
COPY control ./control
COPY cli ./cli
# the export copies these templates into every version (pipelines/export/exporter.py finds
# them beside the code: hence an editable install of /app)
COPY model_repository ./model_repository
RUN pip install --no-deps --no-build-isolation -e .
# the long-running workers' loop (retrain worker, rollout controller): deploy/cascade-loop.sh
COPY --chmod=755 deploy/cascade-loop.sh /usr/local/bin/cascade-loop
USER 10001:10001
WORKDIR /artifacts
ENTRYPOINT ["cascade"]
CMD ["train", "--workdir", "/artifacts/work", "--output", "/artifacts"]

# The gateway: only the serving dependencies (no matplotlib, onnx or tqdm).
FROM serve-deps AS gateway
COPY README.md ./
COPY core ./core
COPY pipelines ./pipelines
COPY services ./services
COPY control ./control
COPY cli ./cli
RUN pip install --no-deps --no-build-isolation -e .
USER 10001:10001
WORKDIR /artifacts
ENV CASCADE_ARTIFACTS=/artifacts
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health/live', timeout=2)"]
ENTRYPOINT ["cascade"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
