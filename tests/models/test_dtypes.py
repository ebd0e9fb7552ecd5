"""One name -> dtype mapping (`models.DTYPES`); every place that takes a dtype name accepts a subset of it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ragen_lit.config import ModelConfig, TrainerConfig
from ragen_lit.diagnose import run as diagnose
from ragen_lit.engines import vllm
from ragen_lit.models import DTYPES, resolve_dtype
from ragen_lit.parallel import fsdp


def choices(config_class, name: str) -> tuple[str, ...]:
    return {f.name: f for f in dataclasses.fields(config_class)}[name].metadata["choices"]


def test_names_map_to_torch_dtypes():
    assert DTYPES == {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    for name, dtype in DTYPES.items():
        assert resolve_dtype(name) is dtype


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto is bfloat16 on a GPU")
def test_auto_is_float32_on_cpu():
    assert resolve_dtype("auto") is torch.float32


def test_every_place_accepts_a_subset_of_the_one_mapping():
    assert vllm._DTYPES == ("bfloat16", "float16", "float32", "auto")
    assert diagnose.DTYPES == ("float32", "bfloat16")
    assert set(diagnose.DTYPES) <= set(DTYPES)
    assert set(choices(ModelConfig, "dtype")) == {*DTYPES, "auto"}
    for name in ("fsdp_param_dtype", "fsdp_reduce_dtype"):
        assert set(choices(TrainerConfig, name)) == set(DTYPES)
    assert fsdp.DTYPES is DTYPES
