"""`run.bounds.cuda_devices`: the GPUs torch sees, counted without importing torch where it cannot see one (a build
without CUDA or ROCm, read from its `version.py`), so that `fit`'s refusals come before torch loads."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from ragen_lit.run import bounds
from ragen_lit.run.bounds import _torch_gpu_build, cuda_devices


def test_the_installed_torchs_build_is_read_as_torch_states_it():
    assert _torch_gpu_build() == ("cuda" if torch.version.cuda else "hip" if torch.version.hip else None)
    assert cuda_devices() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


@pytest.mark.parametrize(
    ("text", "build"),
    [
        ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n", None),
        ("__version__ = '2.13.0'\ncuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", "cuda"),
        ("__version__ = '2.13.0+rocm6.4'\ncuda = None\nhip = '6.4.43484'\n", "hip"),
        ("cuda = None\n", "cuda"),  # a file that does not say both: torch is asked
        ("cuda = (\n", "cuda"),  # unreadable: torch is asked
    ],
)
def test_a_torch_build_is_read_from_its_version_file(tmp_path, monkeypatch, text, build):
    (tmp_path / "version.py").write_text(text)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: SimpleNamespace(submodule_search_locations=[str(tmp_path)]) if name == "torch" else real(name),
    )
    assert bounds._torch_gpu_build() == build
