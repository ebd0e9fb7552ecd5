import ctypes
import os
import socket
import tempfile
from pathlib import Path

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


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_CAP_VERSION_3, _CAP_DAC_OVERRIDE = 0x20080522, 1


def _set_dac_override(enabled: bool) -> bool:
    """Raise or lower CAP_DAC_OVERRIDE (root's licence to write anywhere) in this thread's effective set."""
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return False
    bit = 1 << _CAP_DAC_OVERRIDE
    data[0].effective = data[0].effective | bit if enabled else data[0].effective & ~bit
    return libc.capset(ctypes.byref(header), data) == 0


def _can_write_in(folder: Path) -> bool:
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except PermissionError:
        return False
    return True


@pytest.fixture
def make_unwritable():
    """`make_unwritable(folder)`: the folder refuses new files for the rest of the test, with a real EACCES from the
    OS. chmod alone does not stop root, so as root this thread also lowers CAP_DAC_OVERRIDE (Lightning trains in
    the test's thread); both are undone at teardown. Skips where neither works."""
    locked: list[Path] = []
    lowered = False

    def lock(folder: Path) -> None:
        nonlocal lowered
        folder.chmod(0o555)
        locked.append(folder)
        if _can_write_in(folder) and not lowered:
            lowered = _set_dac_override(False)
        if _can_write_in(folder):
            pytest.skip("cannot make a folder unwritable on this machine (root without capset)")

    yield lock
    if lowered:
        _set_dac_override(True)
    for folder in locked:
        folder.chmod(0o755)
