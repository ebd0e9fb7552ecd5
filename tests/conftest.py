import os
import socket

import pytest

# Tests never reach a model hub, and one torch thread per process keeps a busy 2-core machine usable.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, for a test's `init_process_group` rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A small build of the embedded tiny model (the real builder, a reduced SFT budget), shared by
    the end-to-end tests; the full recipe is exercised by `scripts/build_tiny_model.py`."""
    from ragen_lit.presets.tiny.build import TinyRecipe, build_tiny_model

    recipe = TinyRecipe(sft_episodes=120, other_env_episodes=8, sft_steps=60, val_envs=0, corpus_episodes=60)
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", recipe=recipe, log=lambda _: None)
