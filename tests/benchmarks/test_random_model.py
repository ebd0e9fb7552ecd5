"""`bench.random_model`: the shapes build the published parameter counts (on the meta device: no memory),
and the --smoke shape takes the tokenizer's vocabulary."""

from __future__ import annotations

import pytest
import torch
import transformers

from bench.random_model import SMOKE, qwen_config


class Tokenizer:
    """What `qwen_config` reads of a tokenizer."""

    pad_token_id, eos_token_id = 0, 1

    def __len__(self) -> int:
        return 1540


@pytest.mark.parametrize(("model", "parameters"), [("qwen2.5-0.5b", 494_032_768), ("qwen2.5-3b", 3_085_938_688)])
def test_shapes_have_the_published_parameter_counts(model, parameters):
    with torch.device("meta"):
        random_init = transformers.Qwen2ForCausalLM(qwen_config(Tokenizer(), model))
    assert sum(p.numel() for p in random_init.parameters()) == parameters


def test_smoke_shape_takes_the_tokenizers_vocabulary():
    config = qwen_config(Tokenizer(), SMOKE)
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (1540, 64, 2)
    assert (config.pad_token_id, config.eos_token_id) == (0, 1)
