"""Build the embedded default model `model: tiny` offline, in well under two minutes on 2 CPU cores.

Steps (all deterministic given `TinyRecipe.seed` and the thread count):

1. render expert episodes of every env through the real chat template and rollout loop with a
   byte-only tokenizer, and train the byte-level BPE on that text (`tiny/tokenizer.py`);
2. roll out the scripted expert (`tiny/expert.py`, imperfect with probability `epsilon` per turn)
   with the trained tokenizer: multi-turn FrozenLake episodes with the project's default limits plus
   a few episodes of the other envs (and of `TinyRecipe.extra_envs`, each with the options and limits
   `fit` plays it with), giving token ids and loss masks exactly as RL will see them;
3. initialise a small causal LM from the seed and fine-tune it on those trajectories (`presets/sft.py`);
4. measure validation success (FrozenLake 4x4, p=0.8, seeds 123.., temperature 0.5) with the
   transformers engine; below `min_val_success`, redo step 3 from the next seed (at most
   `max_attempts` in all); measure the kept model on each extra env the same way, then save model +
   tokenizer + `tiny_build.json` (recipe and summary).

Why these numbers (sweeps of builds x RL runs, docs/PERFORMANCE.md): with `epsilon` 0.45 the expert
says "I try <random move>" on almost half of its turns, and the imitating policy keeps doing so on
about 40% of them even at temperature 0.5 — that is the room RL is given, and a decision it can
learn to drop. 1400 SFT steps make the careful way of playing reliable (700 steps left validation
success anywhere between 0.19 and 0.57 over seeds of one recipe, and from starts below ~0.25 RL
barely moved). A warm start below `min_val_success` is still retrained from the next seed.

The architecture is Qwen3 (Qwen2's layout plus q/k norms, no q/k/v biases) rather than Qwen2:
transformers 5 loads every `model_type: qwen2` folder with `Qwen2Tokenizer`, which rebuilds its own
word-splitting pre-tokenizer and ignores the one saved in tokenizer.json, so `AutoTokenizer` would
silently re-tokenize this model's text; for `qwen3` it honours the saved tokenizer. The size (hidden
64, 2 layers) and the SFT budget were chosen by measurement on 2 CPU cores: at equal time a smaller
model taking more optimizer steps learns to copy and compare board coordinates much sooner than the
hidden-128, 4-layer one (fp32: this CPU has no bf16 matrix units, bf16 runs ~10x slower).

The folder is built in a temporary sibling and renamed into place under a file lock, so concurrent
builders never see a half-written model: the first builds, the others wait and reuse it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from filelock import FileLock
from transformers import Qwen3Config, Qwen3ForCausalLM

from ragen_lit.agent.chat import ChatFormat
from ragen_lit.agent.rollout import rollout
from ragen_lit.config import ValidationConfig
from ragen_lit.engines.base import SamplingParams
from ragen_lit.engines.hf import HFEngine
from ragen_lit.presets.cache import default_cache_dir, discard_folder
from ragen_lit.presets.expert_episodes import SFT_SEED, EnvSetup, expert_episodes
from ragen_lit.presets.sft import supervised_finetune
from ragen_lit.presets.tiny.expert import ExpertEngine
from ragen_lit.presets.tiny.tokenizer import byte_tokenizer, train_tokenizer

FOLDER_NAME = "tiny-v1"
# The envs whose expert episodes the tokenizer and the SFT always see: the four the shipped model was built with.
# An env added later does not change the default build (the shipped folder stays what this builder makes);
# `TinyRecipe.extra_envs` adds others to a build of your own.
TINY_ENVS = ("countdown", "frozenlake", "mathqa", "sokoban")
BUILD_INFO = "tiny_build.json"
LAKE = EnvSetup("frozenlake")  # the env validation measures by default: FrozenLake as `fit` plays it by default
# Far from validation (123..634) and RL training (10000 + 8 * iteration + group), like `SFT_SEED`.
CORPUS_SEED = 5_000_000
VALIDATION_SEED = ValidationConfig().seed  # the first validation seed of `fit` and of the build


@dataclass(frozen=True)
class TinyRecipe:
    """Everything that determines the built model; a cached folder is reused only for the same recipe."""

    vocab_size: int = 1536  # BPE entries (bytes + merges + 3 special tokens); the 4 tags come on top
    corpus_episodes: int = 200  # FrozenLake episodes rendered for the tokenizer corpus (other envs: a quarter each)
    # Sized for 2 CPU cores (a sweep of sizes/steps/epsilon on this machine): small enough that SFT fits
    # the build budget and RL iterations take seconds, large enough to follow the format everywhere.
    hidden_size: int = 64
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    sft_episodes: int = 1200  # FrozenLake expert episodes for SFT
    other_env_episodes: int = 40  # expert episodes of each other env of TINY_ENVS, so the format holds everywhere
    epsilon: float = 0.45  # probability per turn that the expert plays one random move (RL headroom)
    sft_steps: int = 1400
    batch_size: int = 8
    learning_rate: float = 5e-3
    context_weight: float = 0.5  # SFT loss weight of prompt/env tokens relative to sampled ones (auxiliary LM loss)
    val_envs: int = 64  # FrozenLake validation seeds 123.. (0 skips the measurement and the retry)
    min_val_success: float = 0.2  # retrain from the next seed when validation success is below this
    max_attempts: int = 2  # SFT attempts at most (the best one is kept)
    val_temperature: float = 0.5
    seed: int = 0
    threads: int = 2  # torch CPU threads during the build
    extra_envs: tuple[EnvSetup, ...] = ()  # more envs (e.g. coding, search_qa, webshop) the tokenizer and SFT see
    extra_env_episodes: int = 40  # expert episodes of each extra env for SFT

    def setups(self) -> tuple[EnvSetup, ...]:
        """Every env the tokenizer and the SFT see: TINY_ENVS with default options and limits, then the extra ones."""
        return tuple(EnvSetup(name) for name in TINY_ENVS) + tuple(
            e for e in self.extra_envs if e.name not in TINY_ENVS
        )

    def held_out_seeds(self) -> range:
        """The validation seeds whose tasks the tokenizer corpus and the SFT never show: the build's own
        (`val_envs`) and `fit`'s default ones (`validation.num_envs`), whichever reach further."""
        return range(VALIDATION_SEED, VALIDATION_SEED + max(self.val_envs, ValidationConfig().num_envs))

    def envs(self) -> tuple[str, ...]:
        return tuple(setup.name for setup in self.setups())

    def sft_episode_count(self, name: str) -> int:
        if name == "frozenlake":
            return self.sft_episodes
        return self.other_env_episodes if name in TINY_ENVS else self.extra_env_episodes


def build_tiny_model(
    path: Path | str | None = None,
    *,
    force: bool = False,
    recipe: TinyRecipe = TinyRecipe(),
    log: Callable[[str], None] = print,
) -> Path:
    """The folder of the tiny model (tokenizer + `Qwen3ForCausalLM`), built if it is missing, was built
    from another recipe, or `force` is set. Default folder: `default_cache_dir() / "tiny-v1"`."""
    target = Path(path).expanduser() if path is not None else default_cache_dir() / FOLDER_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not force and same_recipe(built_recipe(target), recipe):
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            summary = _build(staging, recipe)
            if target.exists():
                discard_folder(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    log(format_summary(summary))
    return target


def built_recipe(folder: Path) -> dict | None:
    """The recipe a complete tiny-model folder was built from, None if there is none."""
    try:
        return json.loads((folder / BUILD_INFO).read_text())["recipe"]
    except (OSError, ValueError, KeyError):
        return None


def same_recipe(recorded: dict | None, recipe: TinyRecipe) -> bool:
    """Whether a build record's recipe is `recipe`: every field equal, as JSON stores it; a field the record
    predates counts as its default (a record written before `extra_envs` existed built with none)."""
    if recorded is None:
        return False
    wanted = json.loads(json.dumps(dataclasses.asdict(recipe)))
    defaults = json.loads(json.dumps(dataclasses.asdict(TinyRecipe())))
    return set(recorded) <= set(wanted) and all(recorded.get(k, defaults[k]) == v for k, v in wanted.items())


def format_summary(summary: dict) -> str:
    val = summary["val_success"]
    val_text = (
        "skipped" if val is None else f"{val:.1%} on {summary['val_envs']} maps at T={summary['val_temperature']}"
    )
    attempts = summary.get("attempts", [])
    if len(attempts) > 1:
        val_text += f" (best of {len(attempts)} SFT attempts: {', '.join(f'{v:.1%}' for v in attempts)})"
    extra = summary.get("extra_val_success", {})
    if extra:
        val_text += f" ({', '.join(f'{env} {v:.1%}' for env, v in extra.items())})"
    return (
        f"tiny model: {summary['parameters'] / 1e6:.2f}M params, vocab {summary['vocab']}, "
        f"{summary['sft_steps']} SFT steps on {summary['sft_episodes']} expert episodes "
        f"(epsilon {summary['epsilon']}), "
        f"final loss {summary['final_loss']:.3f}, validation success {val_text}, "
        f"expert success {summary['expert_success']:.1%}, built in {summary['build_seconds']:.0f}s "
        f"({', '.join(f'{stage} {s:.0f}s' for stage, s in summary['seconds'].items())})"
    )


def _build(folder: Path, recipe: TinyRecipe) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    clock = time.perf_counter()
    seconds: dict[str, float] = {}

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[stage] = round(now - clock, 1)
        clock = now

    try:
        tokenizer = train_tokenizer(tokenizer_corpus(recipe), recipe.vocab_size)
        lap("tokenizer")
        chat = ChatFormat(tokenizer)
        expert = ExpertEngine(tokenizer, epsilon=recipe.epsilon, seed=recipe.seed)
        episodes = {
            setup.name: expert_episodes(
                expert, chat, setup, SFT_SEED, recipe.sft_episode_count(setup.name), held_out=recipe.held_out_seeds()
            )
            for setup in recipe.setups()
        }
        lake = episodes["frozenlake"]
        others = [t for name, trajectories in episodes.items() if name != "frozenlake" for t in trajectories]
        lap("expert")
        # SFT outcomes of this small model vary with the initialisation and batch order, and RL barely
        # moves a weak warm start (module docstring): an attempt that validates below
        # `min_val_success` is retried with the next seed, and the best attempt is kept.
        attempts, best = [], None
        for attempt in range(recipe.max_attempts):
            seed = recipe.seed + attempt
            torch.manual_seed(seed)
            model = Qwen3ForCausalLM(model_config(recipe, tokenizer))
            losses = supervised_finetune(
                model,
                lake + others,
                steps=recipe.sft_steps,
                batch_size=recipe.batch_size,
                learning_rate=recipe.learning_rate,
                pad_token_id=tokenizer.pad_token_id,
                seed=seed,
                context_weight=recipe.context_weight,
            )
            lap(f"sft{attempt + 1}")
            val_success = validation_success(model, chat, recipe) if recipe.val_envs > 0 else None
            lap(f"validation{attempt + 1}")
            attempts.append(val_success)
            if best is None or (val_success or 0.0) > (best[0] or 0.0):
                best = (val_success, model, losses)
            if val_success is None or val_success >= recipe.min_val_success:
                break
        val_success, model, losses = best
        # the extra envs are measured on the kept model only: the retry above stays FrozenLake's
        extra_val_success = {
            setup.name: validation_success(model, chat, recipe, setup)
            for setup in (recipe.setups()[len(TINY_ENVS) :] if recipe.val_envs > 0 else ())
        }
        if extra_val_success:
            lap("validation_extra")
        summary = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "vocab": len(tokenizer),
            "sft_steps": recipe.sft_steps,
            "sft_episodes": len(lake) + len(others),
            "epsilon": recipe.epsilon,
            "final_loss": sum(losses[-10:]) / len(losses[-10:]),
            "expert_success": sum(t.success for t in lake) / len(lake),
            "val_success": val_success,
            "attempts": attempts,
            **({"extra_val_success": extra_val_success} if extra_val_success else {}),
            "val_envs": recipe.val_envs,
            "val_temperature": recipe.val_temperature,
        }
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        lap("save")
        summary["seconds"] = seconds
        summary["build_seconds"] = sum(seconds.values())
        (folder / BUILD_INFO).write_text(
            json.dumps({"recipe": dataclasses.asdict(recipe), "summary": summary}, indent=2)
        )
        return summary
    finally:
        torch.set_num_threads(threads)


def tokenizer_corpus(recipe: TinyRecipe) -> list[str]:
    """Full chat transcripts of expert episodes of every env, rendered with the byte-only tokenizer
    (so the corpus holds exactly the text the model will read and write)."""
    tokenizer = byte_tokenizer()
    chat = ChatFormat(tokenizer)
    expert = ExpertEngine(tokenizer, epsilon=0.3, seed=recipe.seed)
    texts = []
    for setup in recipe.setups():
        count = recipe.corpus_episodes if setup.name == "frozenlake" else max(1, recipe.corpus_episodes // 4)
        episodes = expert_episodes(
            expert, chat, setup, CORPUS_SEED, count, max_new_tokens=1024, held_out=recipe.held_out_seeds()
        )
        for trajectory in episodes:
            texts.append(tokenizer.decode(trajectory.token_ids, skip_special_tokens=False))
    return texts


def model_config(recipe: TinyRecipe, tokenizer) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.hidden_size // recipe.num_heads,
        max_position_embeddings=tokenizer.model_max_length,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def validation_success(model: torch.nn.Module, chat: ChatFormat, recipe: TinyRecipe, setup: EnvSetup = LAKE) -> float:
    """Success rate of `model` on the validation seeds 123.. of `setup`'s env, one rollout each (as `fit`
    validates with that setup's config, `validation.num_envs=recipe.val_envs`)."""
    seeds = list(range(VALIDATION_SEED, VALIDATION_SEED + recipe.val_envs))
    engine = HFEngine(model, pad_token_id=chat.tokenizer.pad_token_id)
    sampling = SamplingParams(temperature=recipe.val_temperature, seed=recipe.seed)
    trajectories = rollout(engine, setup.make_env, seeds, seeds, chat, setup.limits, sampling)
    return sum(t.success for t in trajectories) / len(trajectories)
