"""Online template-collapse diagnostics (docs/METHOD.md §3): pick (X, Z) pairs from this iteration's
rollouts, cross-score every reasoning under every prompt with the current policy, and feed the MI
metric family. Two scopes, computed before filtering:

- first turn: one pair per trajectory (its turn-1 prompt and reasoning), prompt identity = group,
  at most `num_samples` pairs drawn without replacement;
- trajectory: `num_samples` pairs drawn with replacement, a trajectory uniformly then one of its valid
  turns uniformly; every pair is its own column (prompts that are token-identical share a column
  group, so retrieval counts a hit on any copy).

In distributed runs the pairs are drawn once over all ranks' trajectories: a small summary of each
(`Candidate`) is all-gathered and put in group order (the single process's order of the same rollouts),
and every rank makes the same seeded draw. Each rank then scores the drawn pairs of its own trajectories
against all columns (their prompts are all-gathered), so N, the chance level and the metric states (sums,
reduced over ranks) are those of one process on all the rollouts.

Template collapse at three layers, one module each: `metrics.collapse` computes the diagnostics during a run,
`analysis.collapse` reads their logged streams for `compare --collapse`, `figures.collapse` draws that reading.
"""

from __future__ import annotations

import random
import time
from typing import NamedTuple

import torch
from torch import nn
from torch.profiler import record_function

from ragen_lit.metrics import MIDiagnostics
from ragen_lit.metrics.cross_scoring import cross_score_scopes
from ragen_lit.models import kv_heads_and_dim
from ragen_lit.parallel import collectives as dist_utils
from ragen_lit.seeds import DIAGNOSTIC_DRAWS, derive_seed


def column_groups_of(prompts: list[list[int]]) -> torch.Tensor:
    """[N] long: columns with token-identical prompts share an id."""
    ids: dict[tuple[int, ...], int] = {}
    return torch.tensor([ids.setdefault(tuple(p), len(ids)) for p in prompts], dtype=torch.long)


class Candidate(NamedTuple):
    """What the pair draw needs of one trajectory (all-gathered over ranks, so nothing large)."""

    group: int
    num_turns: int
    valid_turns: int  # turns with a non-empty reasoning
    first_turn_valid: bool

    @classmethod
    def of(cls, trajectory) -> Candidate:
        turns = trajectory.turns
        return cls(
            trajectory.group,
            len(turns),
            sum(bool(turn.reasoning) for turn in turns),
            bool(turns and turns[0].reasoning),
        )


def first_turn_pairs(candidates: list[Candidate], num_samples: int, rng: random.Random) -> list[tuple[int, int, int]]:
    """[(candidate index, valid-turn index 0, column key = group)]: one per candidate with a valid first-turn
    reasoning, at most `num_samples` of them drawn without replacement."""
    entries = [i for i, c in enumerate(candidates) if c.first_turn_valid]
    if len(entries) > num_samples:
        entries = rng.sample(entries, num_samples)
    return [(i, 0, candidates[i].group) for i in entries]


def trajectory_pairs(candidates: list[Candidate], num_samples: int, rng: random.Random) -> list[tuple[int, int, int]]:
    """[(candidate index, valid-turn index, column key = draw index k)], min(`num_samples`, valid turns) draws
    with replacement: a candidate with a valid turn uniformly, then one of its valid turns uniformly."""
    valid = [i for i, c in enumerate(candidates) if c.valid_turns]
    total = sum(candidates[i].valid_turns for i in valid)
    pairs = []
    for k in range(min(num_samples, total)):
        i = rng.choice(valid)
        pairs.append((i, rng.randrange(candidates[i].valid_turns), k))
    return pairs


def kv_bytes_per_token(config, element_size: int) -> int:
    """Bytes of keys and values one token adds to a full KV cache of a transformers decoder config."""
    kv_heads, head_dim = kv_heads_and_dim(config)
    return 2 * config.get_text_config(decoder=True).num_hidden_layers * kv_heads * head_dim * element_size


def gpu_tokens_per_forward(allowed_memory: int, kv_bytes: int) -> int:
    """The auto bound on a GPU: padded tokens whose cache copies take 1/20 of the memory this process may
    allocate there, within [8192, 262144]. An H100 and the Qwen2.5-0.5B shape (12 KiB per token) get 262144,
    where the bench's diagnostics iteration took 4.8 s against 6.3 s at 65536 (an H100, commit 0d28cb1)."""
    return int(min(262144, max(8192, allowed_memory // 20 // kv_bytes)))


def tokens_per_forward(policy, max_tokens_per_forward: int) -> int:
    """The cross-scorer's memory bound (`diagnostics.max_tokens_per_forward`, also `diagnose`'s): a set value,
    or for 0 (auto) 8192 on a CPU and `gpu_tokens_per_forward` of the model and the memory this process may
    allocate on its GPU: the card's, or the share `trainer.gpu_memory_fraction` caps it at (runs sharing a card
    under `sweep --devices 0,0,0`). Small forwards, each over a copy of a ~900-token prompt cache, are bound by
    kernel launches and Python, not by the GPU."""
    if max_tokens_per_forward:
        return max_tokens_per_forward
    param = next(policy.parameters())
    if param.device.type != "cuda":
        return 8192
    total = torch.cuda.get_device_properties(param.device).total_memory
    allowed = int(total * torch.cuda.get_per_process_memory_fraction(param.device))
    return gpu_tokens_per_forward(allowed, kv_bytes_per_token(policy.config, param.element_size()))


def _mark(device: torch.device):
    """A point in time of the work queued on `device`: a CUDA event on a GPU (read after the work is done), the host's
    clock elsewhere (where the work runs as it is called)."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _seconds(start, stop) -> float:
    """Seconds between two `_mark`s."""
    if isinstance(start, float):
        return stop - start
    stop.synchronize()
    return start.elapsed_time(stop) / 1000


def sampled_reasoning(trajectory, turn) -> list[int] | str:
    """The reasoning Z of `turn` as the policy sampled it: its token ids (`Turn.reasoning_end`), or its text where no
    token boundary separates it from `</think>` (then scored as the tokenizer encodes it)."""
    if turn.reasoning_end is None:
        return turn.reasoning
    return trajectory.token_ids[turn.prompt_end : turn.reasoning_end]


class CollapseDiagnostics(nn.Module):
    """Holds one `MIDiagnostics` per scope (their EMA state is checkpointed with the module), computed as the config's
    `diagnostics` section asks."""

    def __init__(self, diagnostics):
        super().__init__()
        self.cfg = diagnostics
        # on the host (see `_apply`); the states sync over ranks through the backend's device
        self.first_turn = MIDiagnostics(dist_sync_fn=dist_utils.gather_via_backend_device)
        self.trajectory = MIDiagnostics(dist_sync_fn=dist_utils.gather_via_backend_device)

    def _apply(self, fn, recurse=True):
        """The metrics stay on the host when the module moves to a GPU: each diagnostics iteration ends with their
        updates and computes, ~400 operations on scalars, which took ~13 ms of host launches and waits while the
        device idled on an H200 (docs/PERFORMANCE.md), and a few ms on the host alone."""
        return self

    def due(self, iteration: int) -> bool:
        every = self.cfg.every_n_iterations
        return bool(every) and iteration % every == 0

    @torch.no_grad()
    def maybe_compute(
        self, policy, chat, trajectories, iteration: int, temperature: float = 1.0, compile_head: bool = False
    ) -> dict[str, float]:
        """The collapse metrics of this iteration's rollouts ({} when not due). A collective under several
        ranks: every rank calls it with its own `trajectories`; all get the values of all ranks' rollouts.
        `compile_head`: the scorer's vocabulary head through `torch.compile` (`model.compile`)."""
        if not self.due(iteration):
            return {}
        gathered, offset = dist_utils.gather_lists([Candidate.of(t) for t in trajectories])
        # group order is the single process's order of the same rollouts (ranks are dealt groups round-robin)
        order = sorted(range(len(gathered)), key=lambda i: gathered[i].group)
        candidates = [gathered[i] for i in order]
        # the same draw on every rank
        rng = random.Random(derive_seed(iteration, DIAGNOSTIC_DRAWS))
        out = {
            "collapse/valid_reasoning_rate": sum(c.valid_turns for c in candidates)
            / max(sum(c.num_turns for c in candidates), 1),
            "collapse/first_turn_valid_rate": sum(c.first_turn_valid for c in candidates) / max(len(candidates), 1),
        }
        # a draw's trajectory, if this rank holds it
        local = {j: trajectories[i - offset] for j, i in enumerate(order) if offset <= i < offset + len(trajectories)}
        was_training = policy.training
        policy.eval()
        try:
            scopes = []
            if self.cfg.first_turn:
                scopes.append(("first_turn", self.first_turn, first_turn_pairs(candidates, self.cfg.num_samples, rng)))
            if self.cfg.trajectory:
                scopes.append(("trajectory", self.trajectory, trajectory_pairs(candidates, self.cfg.num_samples, rng)))
            with record_function("ragen/diagnostics.inputs"):  # the regions name the host's work in profiles
                inputs = self._inputs(chat, [pairs for _, _, pairs in scopes], local)
            # both scopes scored in shared forwards (a scope of its own would add forwards whose layer calls keep the
            # device waiting on the host), queued before any result is read
            device = next(policy.parameters()).device
            scoring = [i for i, scope in enumerate(inputs) if scope is not None and scope[1]]
            started = _mark(device)
            scored = (
                self._cross_score(policy, chat, [inputs[i] for i in scoring], temperature, compile_head)
                if scoring
                else []
            )
            scores = dict(zip(scoring, scored, strict=True))
            stopped = _mark(device)
            for i, ((name, metric, _), scope) in enumerate(zip(scopes, inputs, strict=True)):
                with record_function("ragen/diagnostics.metrics"):
                    values = self._metrics(metric, scope, scores.get(i))  # ends on the host (.cpu())
                # '@' is not allowed in MLflow metric names: recall@2 is logged as recall_at2
                out.update({f"collapse/{name}/{k.replace('@', '_at')}": v for k, v in values.items()})
            if scoring:  # where the diagnostics time goes (a clock: under time/, with the iteration's phases)
                out["time/diagnostics_scoring_s"] = _seconds(started, stopped)
        finally:
            policy.train(was_training)
        return out

    def _inputs(self, chat, scopes, local) -> list[tuple[list[list[int]], list[tuple[list[int] | str, int]]] | None]:
        """Per scope (its drawn pairs in `scopes`), `(prompts, mine)`: every column's prompt, and this rank's share of
        the drawn pairs (those whose trajectory is in `local`) as (reasoning, column), the reasoning as its sampled
        token ids (`sampled_reasoning`). One column per distinct key
        (group for first turn, draw index for trajectory scope), its prompt that of the key's first pair, supplied by
        the rank holding that pair's trajectory. None for a scope with fewer than two columns (then on every rank:
        they drew the same pairs)."""

        def drawn_turn(j: int, t: int):
            return [turn for turn in local[j].turns if turn.reasoning][t]

        found = []
        for pairs in scopes:
            first_pair = {}
            for j, t, key in pairs:
                first_pair.setdefault(key, (j, t))
            if len(first_pair) < 2:
                found.append(None)
                continue
            column = {key: c for c, key in enumerate(first_pair)}
            owned = [
                (column[key], local[j].token_ids[: drawn_turn(j, t).prompt_end])
                for key, (j, t) in first_pair.items()
                if j in local
            ]
            prompts = [prompt for _, prompt in sorted(dist_utils.gather_lists(owned)[0], key=lambda owned: owned[0])]
            found.append(
                (
                    prompts,
                    [(sampled_reasoning(local[j], drawn_turn(j, t)), column[key]) for j, t, key in pairs if j in local],
                )
            )
        return found

    def _cross_score(self, policy, chat, scopes, temperature: float, compile_head: bool) -> list[tuple]:
        """This rank's rows of each scope scored under every column's prompt of that scope, in shared forwards:
        `cross_score_scopes`' (L_tok, L_sum) per scope, queued on the device and not read. The reasonings are their
        sampled token ids; the few given as text (`sampled_reasoning`) are tokenised in one call, which the scorer
        makes while the device encodes the prompts."""

        def reasonings() -> list[list[list[int]]]:
            texts = [z for _, mine in scopes for z, _ in mine if isinstance(z, str)]
            encoded = iter(chat.encode_many(texts) if texts else [])
            return [[next(encoded) if isinstance(z, str) else z for z, _ in mine] for _, mine in scopes]

        return cross_score_scopes(
            policy,
            [prompts for prompts, _ in scopes],
            reasonings,
            max_tokens_per_forward=tokens_per_forward(policy, self.cfg.max_tokens_per_forward),
            pad_token_id=chat.tokenizer.pad_token_id,
            temperature=temperature,  # the reasonings were sampled at it, and the old log-probs use it
            compile_head=compile_head,
            attention=self.cfg.attention,  # the masked attention's kernels (`diagnostics.attention`)
        )

    @staticmethod
    def _metrics(metric: MIDiagnostics, scope, scores) -> dict[str, float]:
        """One scope's MI metrics over all ranks (a collective: every rank calls it, with or without rows)."""
        if scope is None:  # every rank drew the same pairs, so all of them return here
            return {}
        prompts, mine = scope
        metric.reset()
        if scores is not None:
            l_tok, l_sum = scores
            target = torch.tensor([c for _, c in mine], dtype=torch.long)
            metric.update(l_tok.double().cpu(), l_sum.double().cpu(), target, column_groups=column_groups_of(prompts))
        return {k: float(v) for k, v in metric.compute().items()}
