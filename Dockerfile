# ragen_lit on a CUDA machine, with the vLLM rollout engine.
#   docker build -t ragen_lit .
#   docker run --gpus all --rm -v "$PWD/runs:/app/runs" ragen_lit fit --config conf/frozenlake.yaml
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Ubuntu's security updates replace exact package versions, so pinning them breaks rebuilds.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential git \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
COPY conf ./conf
COPY scripts ./scripts
RUN pip install --upgrade pip==25.2 \
    && pip install -e ".[vllm,smollm2]"

RUN useradd --create-home --uid 1000 ragen && chown -R ragen /app
USER 1000

ENTRYPOINT ["python", "-m", "ragen_lit"]
CMD ["fit", "--config", "conf/frozenlake.yaml"]
