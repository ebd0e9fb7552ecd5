"""The multi-turn rollout loop: one function serves training (groups × group_size) and validation.

Every turn, all unfinished episodes are generated in one engine call; the sampled ids are appended to
the trajectory unchanged (token-in/token-out), the text is parsed into actions, the actions are
executed in the env, and the env's reply is appended as the next user message. The training sequence
is therefore exactly the ids the policy saw and sampled, with the loss mask on sampled ids only. Envs whose
steps wait on something else (`TextEnv.steps_wait`: the coding sandbox) have a turn's episodes stepped in
threads at once; every episode's own actions still run in order, so results do not depend on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from torch.profiler import record_function

from ragen_lit.agent.chat import ChatFormat
from ragen_lit.agent.parsing import parse_response, reasoning_token_count
from ragen_lit.agent.prompts import ANSWER_CLOSE, system_prompt, user_message
from ragen_lit.agent.trajectory import Trajectory, Turn
from ragen_lit.engines.base import Engine, SamplingParams


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 5
    max_actions_per_turn: int = 2
    max_actions_per_episode: int = 10
    max_new_tokens: int = 100
    max_context_tokens: int = 2048
    format_penalty: float = -0.1

    @classmethod
    def of(cls, rollout_cfg) -> EpisodeLimits:
        """The limits a config's `rollout` section states (its fields of the same names)."""
        return cls(**{f.name: getattr(rollout_cfg, f.name) for f in dataclasses.fields(cls)})


@dataclass
class _Acted:
    """What one turn's actions did to one episode's env."""

    executed: list = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    success: bool | None = None  # None: no valid action ran (the episode's success stays as it was)
    observation: str | None = None


def _act(env, raw_actions: Sequence[str], budget: int) -> _Acted:
    """Run `raw_actions` in order until the budget is spent or the episode ends; invalid ones are skipped."""
    acted = _Acted()
    for raw in raw_actions:
        if len(acted.executed) >= budget or acted.done:
            break
        action = env.parse_action(raw)
        if action is None:
            continue
        obs, reward, terminated, truncated, info = env.step(action)
        if not info.get("action_valid", True):
            continue
        acted.executed.append(action)
        acted.reward += float(reward)
        acted.observation = obs
        acted.success = bool(info.get("success", False))
        acted.done = terminated or truncated
    return acted


def _act_all(envs: Sequence, actions: Sequence[Sequence[str]], budgets: Sequence[int]) -> list[_Acted]:
    """`_act` for every episode: in threads when an env's steps wait (`TextEnv.steps_wait`), else in order."""
    if len(envs) > 1 and any(getattr(e, "steps_wait", False) for e in envs):
        with ThreadPoolExecutor(max_workers=min(len(envs), 32)) as pool:
            return list(pool.map(_act, envs, actions, budgets))
    return [_act(e, a, b) for e, a, b in zip(envs, actions, budgets)]


def rollout(
    engine: Engine,
    make_env: Callable[[], object],
    seeds: Sequence[int],
    groups: Sequence[int],
    chat: ChatFormat,
    limits: EpisodeLimits,
    sampling: SamplingParams,
) -> list[Trajectory]:
    """Run one episode per (seed, group) pair with `engine`; returns the trajectories in input order."""
    tokenizer = chat.tokenizer

    def decode(ids: Sequence[int]) -> str:  # as the turns' texts are decoded (`reasoning_token_count`)
        return tokenizer.decode(ids, skip_special_tokens=False)

    envs = [make_env() for _ in seeds]
    stop_ids = [
        i
        for i in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
        if isinstance(i, int) and i >= 0
    ]
    params = SamplingParams(
        max_new_tokens=limits.max_new_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        stop_sequences=[chat.encode(ANSWER_CLOSE)],
        stop_token_ids=stop_ids,
        seed=sampling.seed,
    )
    trajectories: list[Trajectory] = []
    observations: list[str] = []
    first_messages: list[tuple[str, str]] = []
    for env, seed, group in zip(envs, seeds, groups):
        obs, _ = env.reset(seed=int(seed))
        budget = min(
            limits.max_actions_per_episode, getattr(env, "max_actions_per_episode", limits.max_actions_per_episode)
        )
        trajectories.append(Trajectory(group=int(group), seed=int(seed)))
        first_messages.append(
            (system_prompt(env.instruction, env.actions, limits.max_actions_per_turn), user_message(1, obs, budget))
        )
        observations.append(obs)
    for traj, ids in zip(trajectories, chat.first_prompts_ids(first_messages)):
        traj.append(ids, sampled=False)
    actions_left = [
        min(limits.max_actions_per_episode, getattr(e, "max_actions_per_episode", limits.max_actions_per_episode))
        for e in envs
    ]
    active = list(range(len(envs)))
    for turn in range(1, limits.max_turns + 1):
        if not active:
            break
        if params.seed is not None:
            params.seed = sampling.seed + turn
        generations = engine.generate([trajectories[i].token_ids for i in active], params)
        # named in profiles (`bench.profiling.idle_gaps`): the host's work between two turns' generations
        with record_function("ragen/rollout.turn"):
            # the state each turn's prompt showed, before its actions run
            state_keys = [envs[i].state_key() for i in active]
            texts = tokenizer.batch_decode([gen.token_ids for gen in generations], skip_special_tokens=False)
            parsed_all = [parse_response(text, limits.max_actions_per_turn) for text in texts]
            acted_all = _act_all(
                [envs[i] for i in active], [p.actions for p in parsed_all], [max(actions_left[i], 0) for i in active]
            )
            continuing: list[int] = []  # episodes that get a next turn; their messages are encoded in one call
            messages: list[str] = []
            for i, gen, text, parsed, acted, state_key in zip(
                active, generations, texts, parsed_all, acted_all, state_keys
            ):
                traj = trajectories[i]
                prompt_end = len(traj.token_ids)
                traj.append(gen.token_ids, sampled=True, logprobs=gen.logprobs)
                response_end = len(traj.token_ids)
                executed, turn_reward, done = acted.executed, acted.reward, acted.done
                actions_left[i] -= len(executed)
                if acted.observation is not None:
                    observations[i] = acted.observation
                if acted.success is not None:
                    traj.success = acted.success
                valid = bool(executed)
                if not valid:
                    turn_reward += limits.format_penalty
                reasoning_end = None
                if parsed.reasoning is not None:
                    count = reasoning_token_count(decode, gen.token_ids, text)
                    reasoning_end = None if count is None else prompt_end + count
                traj.turns.append(
                    Turn(
                        prompt_end,
                        response_end,
                        parsed.reasoning,
                        executed,
                        turn_reward,
                        valid,
                        state_key,
                        reasoning_end,
                    )
                )
                traj.reward += turn_reward
                traj.num_actions += len(executed)
                traj.append(chat.close_ids(gen.token_ids), sampled=False)
                if done or actions_left[i] <= 0 or turn == limits.max_turns:
                    continue
                continuing.append(i)
                messages.append(
                    user_message(
                        turn + 1,
                        observations[i],
                        actions_left[i],
                        previous_reward=turn_reward,
                        previous_invalid=not valid,
                    )
                )
            still_active = []
            for i, next_ids in zip(continuing, chat.next_turns_ids(messages)):
                traj = trajectories[i]
                if len(traj.token_ids) + len(next_ids) + limits.max_new_tokens > limits.max_context_tokens:
                    traj.truncated_context = True
                    continue
                traj.append(next_ids, sampled=False)
                still_active.append(i)
        active = still_active
    for env in envs:
        env.close()
    return trajectories
