"""Online template-collapse diagnostics (ragen2.md §3): pick (X, Z) pairs from this iteration's
rollouts, cross-score every reasoning under every prompt with the current policy, and feed the MI
metric family. Two scopes, computed before filtering:

- first turn: one pair per trajectory (its turn-1 prompt and reasoning), prompt identity = group,
  at most `num_samples` pairs drawn without replacement;
- trajectory: `num_samples` pairs drawn with replacement, a trajectory uniformly then one of its valid
  turns uniformly; every pair is its own column (prompts that are token-identical share a column
  group, so retrieval counts a hit on any copy).

In distributed runs every rank contributes its own pairs; prompts are all-gathered so each rank scores
its rows against all columns, and the metric states (sums) reduce exactly.
"""

from __future__ import annotations

import random

import torch
from torch import nn

from ragen_lit.metrics import MIDiagnostics
from ragen_lit.metrics.cross_scoring import cross_score
from ragen_lit.models import kv_heads_and_dim
from ragen_lit.parallel import collectives as dist_utils


def column_groups_of(prompts: list[list[int]]) -> torch.Tensor:
    """[N] long: columns with token-identical prompts share an id."""
    ids: dict[tuple[int, ...], int] = {}
    return torch.tensor([ids.setdefault(tuple(p), len(ids)) for p in prompts], dtype=torch.long)


def first_turn_pairs(trajectories, num_samples: int, rng: random.Random):
    """[(prompt ids, reasoning text, group)] — one per trajectory with a valid first-turn reasoning."""
    entries = [t for t in trajectories if t.turns and t.turns[0].reasoning]
    if len(entries) > num_samples:
        entries = rng.sample(entries, num_samples)
    return [(t.token_ids[: t.turns[0].prompt_end], t.turns[0].reasoning, t.group) for t in entries]


def trajectory_pairs(trajectories, num_samples: int, rng: random.Random):
    """[(prompt ids, reasoning text, column key)] drawn with replacement: trajectory then turn."""
    valid = [(t, [turn for turn in t.turns if turn.reasoning]) for t in trajectories]
    valid = [(t, turns) for t, turns in valid if turns]
    total = sum(len(turns) for _, turns in valid)
    pairs = []
    for k in range(min(num_samples, total)):
        traj, turns = rng.choice(valid)
        turn = rng.choice(turns)
        pairs.append((traj.token_ids[: turn.prompt_end], turn.reasoning, k))
    return pairs


def kv_bytes_per_token(config, element_size: int) -> int:
    """Bytes of keys and values one token adds to a full KV cache of a transformers decoder config."""
    kv_heads, head_dim = kv_heads_and_dim(config)
    return 2 * config.get_text_config(decoder=True).num_hidden_layers * kv_heads * head_dim * element_size


def gpu_tokens_per_forward(total_memory: int, kv_bytes: int) -> int:
    """The auto bound on a GPU: padded tokens whose cache copies take 1/20 of the card, within
    [8192, 262144]. An H100 and the Qwen2.5-0.5B shape (12 KiB per token) get 262144, where the bench's
    diagnostics iteration took 4.8 s against 6.3 s at 65536 (docs/PERFORMANCE.md, run 21)."""
    return int(min(262144, max(8192, total_memory // 20 // kv_bytes)))


def tokens_per_forward(policy, max_tokens_per_forward: int) -> int:
    """The cross-scorer's memory bound (`diagnostics.max_tokens_per_forward`, also `diagnose`'s): a set value,
    or for 0 (auto) 8192 on a CPU and `gpu_tokens_per_forward` of the card and model on a GPU (where small
    forwards, each over a copy of a ~900-token prompt cache, are bound by kernel launches and Python, not by
    the GPU)."""
    if max_tokens_per_forward:
        return max_tokens_per_forward
    param = next(policy.parameters())
    if param.device.type != "cuda":
        return 8192
    total = torch.cuda.get_device_properties(param.device).total_memory
    return gpu_tokens_per_forward(total, kv_bytes_per_token(policy.config, param.element_size()))


class CollapseDiagnostics(nn.Module):
    """Holds one `MIDiagnostics` per scope (their EMA state is checkpointed with the module)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.first_turn = MIDiagnostics()
        self.trajectory = MIDiagnostics()

    def due(self, iteration: int) -> bool:
        every = self.cfg.every_n_iterations
        return bool(every) and iteration % every == 0

    @torch.no_grad()
    def maybe_compute(self, policy, chat, trajectories, iteration: int, temperature: float = 1.0) -> dict[str, float]:
        if not self.due(iteration):
            return {}
        rng = random.Random(1_000_003 * iteration + dist_utils.rank_and_world()[0])
        turns = [turn for t in trajectories for turn in t.turns]
        out = {
            "collapse/valid_reasoning_rate": sum(turn.reasoning is not None and turn.reasoning != "" for turn in turns)
            / max(len(turns), 1),
            "collapse/first_turn_valid_rate": sum(bool(t.turns and t.turns[0].reasoning) for t in trajectories)
            / max(len(trajectories), 1),
        }
        was_training = policy.training
        policy.eval()
        try:
            scopes = []
            if self.cfg.first_turn:
                scopes.append(
                    ("first_turn", self.first_turn, first_turn_pairs(trajectories, self.cfg.num_samples, rng))
                )
            if self.cfg.trajectory:
                scopes.append(
                    ("trajectory", self.trajectory, trajectory_pairs(trajectories, self.cfg.num_samples, rng))
                )
            for name, metric, pairs in scopes:
                # '@' is not allowed in MLflow metric names: recall@2 is logged as recall_at2
                out.update(
                    {
                        f"collapse/{name}/{k.replace('@', '_at')}": v
                        for k, v in self._score(policy, chat, metric, pairs, temperature).items()
                    }
                )
        finally:
            policy.train(was_training)
        return out

    def _score(self, policy, chat, metric: MIDiagnostics, pairs, temperature: float) -> dict[str, float]:
        # one column per distinct key (group for first turn, draw index for trajectory scope)
        keys = list(dict.fromkeys(key for _, _, key in pairs))
        column_prompt = {}
        for prompt, _, key in pairs:
            column_prompt.setdefault(key, prompt)
        local_prompts = [column_prompt[k] for k in keys]
        prompts, offset = dist_utils.gather_lists(local_prompts)
        if len(prompts) < 2:
            return {}
        reasonings = [chat.encode(text) for _, text, _ in pairs]
        target = torch.tensor([offset + keys.index(key) for _, _, key in pairs], dtype=torch.long)
        metric.reset()
        if pairs:
            l_tok, l_sum = cross_score(
                policy,
                prompts,
                reasonings,
                max_tokens_per_forward=tokens_per_forward(policy, self.cfg.max_tokens_per_forward),
                pad_token_id=chat.tokenizer.pad_token_id,
                temperature=temperature,  # the reasonings were sampled at it, and the old log-probs use it
            )
            metric.update(l_tok.double().cpu(), l_sum.double().cpu(), target, column_groups=column_groups_of(prompts))
        values = metric.compute()
        return {k: float(v) for k, v in values.items()}
