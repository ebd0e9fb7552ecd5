"""The rollout loop's token-in/token-out contract, with a scripted engine (no model)."""

import threading
import time
from functools import partial

import pytest

from ragen_lit.agent.chat import ChatFormat
from ragen_lit.agent.rollout import EpisodeLimits, rollout
from ragen_lit.engines.base import Generation, SamplingParams
from ragen_lit.envs import FrozenLakeEnv
from ragen_lit.presets.tiny.tokenizer import train_tokenizer
from ragen_lit.training.batch import collate

# the rollout loop over a tokenizer; CI also runs these at the lowest declared versions
pytestmark = pytest.mark.floors

GRID = ["SFFF", "FHFH", "FFFH", "HFFG"]
DEFAULT_LIMITS = EpisodeLimits()


@pytest.fixture(scope="module")
def chat():
    corpus = [
        FrozenLakeEnv.from_grid(GRID).reset(seed=0)[0],
        "Right Down Left Up Reward Turn State You have actions left",
    ] * 20
    return ChatFormat(train_tokenizer(corpus, vocab_size=400))


class ScriptedEngine:
    """Answers turn t of every episode with `replies[t]`; records the prompts it saw."""

    def __init__(self, chat, replies, eos=True):
        self.chat, self.replies, self.eos = chat, replies, eos
        self.prompts = []
        self.calls = 0

    def generate(self, prompts, params):
        self.prompts.append([list(p) for p in prompts])
        text = self.replies[self.calls]
        self.calls += 1
        ids = self.chat.encode(text)
        if self.eos:
            ids = ids + [self.chat.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        return [Generation(list(ids), [-0.5] * len(ids), "stop") for _ in prompts]

    def sync(self, model):
        pass


def _run(chat, replies, limits=DEFAULT_LIMITS, n=2, eos=True):
    engine = ScriptedEngine(chat, replies, eos=eos)
    make = partial(FrozenLakeEnv.from_grid, GRID)
    trajs = rollout(engine, make, [0] * n, [0] * n, chat, limits, SamplingParams(seed=1))
    return engine, trajs


def test_training_sequence_is_the_concatenation_of_fed_and_sampled_ids(chat):
    replies = [
        "go</think><answer>Right || Right</answer>",
        "down</think><answer>Down || Down</answer>",
        "x</think><answer>Right || Down</answer>",
    ]
    engine, trajs = _run(chat, replies)
    traj = trajs[0]
    # every prompt the engine saw is a prefix of the final sequence (nothing re-tokenised)
    for turn_prompts in engine.prompts:
        assert traj.token_ids[: len(turn_prompts[0])] == turn_prompts[0]
    # the loss mask covers exactly the sampled ids of each turn
    sampled = [i for i, m in enumerate(traj.loss_mask) if m]
    expected = [i for turn in traj.turns for i in range(turn.prompt_end, turn.response_end)]
    assert sampled == expected
    for turn, reply in zip(traj.turns, replies):
        assert traj.token_ids[turn.prompt_end : turn.response_end] == chat.encode(reply) + [
            chat.tokenizer.convert_tokens_to_ids("<|im_end|>")
        ]
        assert traj.token_ids[turn.prompt_end - len(chat.think_open_ids) : turn.prompt_end] == chat.think_open_ids
    assert traj.sample_logprobs[traj.turns[0].prompt_end] == -0.5
    assert traj.sample_logprobs[0] == 0.0


def test_each_turn_knows_its_reasonings_sampled_tokens(chat):
    """`Turn.reasoning_end`: token_ids[prompt_end:reasoning_end] are the reasoning as sampled (the diagnostics score
    these, not a re-encoding of the stripped text); a broken turn has none."""
    replies = [" go  right </think><answer>Right</answer>", "no tags at all", "x</think><answer>Down</answer>"]
    _, trajs = _run(chat, replies)
    first, broken = trajs[0].turns[0], trajs[0].turns[1]
    sampled = trajs[0].token_ids[first.prompt_end : first.reasoning_end]
    assert chat.tokenizer.decode(sampled) == " go  right " and first.reasoning == "go  right"
    assert trajs[0].token_ids[first.reasoning_end : first.response_end][: len(chat.encode("</think>"))] == chat.encode(
        "</think>"
    )
    assert broken.reasoning is None and broken.reasoning_end is None


def test_episode_dynamics_rewards_and_success(chat):
    # (0,0) -R-> (0,1) -R-> (0,2) | -D-> (1,2) -D-> (2,2) | -D-> (3,2) -R-> (3,3) goal
    replies = [
        "a</think><answer>Right || Right</answer>",
        "b</think><answer>Down || Down</answer>",
        "c</think><answer>Down || Right</answer>",
        "never</think><answer>Up</answer>",
    ]
    engine, trajs = _run(chat, replies)
    traj = trajs[0]
    assert engine.calls == 3 and len(traj.turns) == 3
    assert traj.success and traj.reward == pytest.approx(1.0) and traj.num_actions == 6
    assert [t.reward for t in traj.turns] == [0.0, 0.0, 1.0]
    batch = collate(trajs, pad_token_id=chat.tokenizer.pad_token_id)
    last = traj.turns[-1].response_end - 1
    assert batch["token_rewards"][0].nonzero().flatten().tolist() == [last]
    assert batch["loss_mask"][0].sum() == sum(t.response_end - t.prompt_end for t in traj.turns)
    assert batch["turn_end_mask"][0].nonzero().flatten().tolist() == [t.response_end - 1 for t in traj.turns]
    # each turn carries the state its prompt showed (GiGPO's anchor), before that turn's actions ran
    assert [t.state_key for t in traj.turns] == [(0, 0), (0, 2), (2, 2)]
    # collate numbers the states of the batch on the turn ends: both rollouts visit the same three cells
    ids = batch["turn_state_ids"]
    ends = [t.response_end - 1 for t in traj.turns]
    assert ids[0, ends].tolist() == ids[1, ends].tolist() == [0, 1, 2]
    assert (ids >= 0).sum() == 6 and (ids[batch["turn_end_mask"]] >= 0).all()


def test_format_penalty_and_invalid_actions(chat):
    replies = ["no tags at all", "x</think><answer>Jump</answer>", "x</think><answer>jump || Down</answer>"]
    _, trajs = _run(chat, replies, EpisodeLimits(max_turns=3))
    traj = trajs[0]
    assert [t.valid for t in traj.turns] == [False, False, True]
    assert [t.reward for t in traj.turns] == pytest.approx([-0.1, -0.1, 0.0])
    assert traj.turns[0].reasoning is None and traj.turns[1].reasoning == "x"
    assert traj.turns[2].actions == ["Down"]
    assert traj.reward == pytest.approx(-0.2)


def test_hole_ends_episode_and_action_budget(chat):
    _, trajs = _run(chat, ["x</think><answer>Down || Right</answer>", "y</think><answer>Up</answer>"])
    assert len(trajs[0].turns) == 1 and not trajs[0].success  # (1,0) then (1,1) is a hole
    _, trajs = _run(chat, ["x</think><answer>Left || Left</answer>"] * 5, EpisodeLimits(max_actions_per_episode=3))
    assert trajs[0].num_actions == 3 and len(trajs[0].turns) == 2


def test_user_messages_carry_reward_and_warning(chat):
    engine, _ = _run(
        chat,
        ["bad", "x</think><answer>Right</answer>", "x</think><answer>Right</answer>"],
        EpisodeLimits(max_turns=3),
        n=1,
    )
    second = chat.tokenizer.decode(engine.prompts[1][0])
    assert "Reward: -0.1\nNo valid action provided previously" in second
    assert second.endswith("<|im_start|>assistant\n<think>")


def test_close_ids_without_model_eos(chat):
    _, trajs = _run(chat, ["x</think><answer>Right</answer>"] * 2, EpisodeLimits(max_turns=2), n=1, eos=False)
    traj = trajs[0]
    end = traj.turns[0].response_end
    assert traj.token_ids[end : end + len(chat.assistant_close_ids)] == chat.assistant_close_ids
    assert not any(traj.loss_mask[end : end + len(chat.assistant_close_ids)])


def test_context_limit_truncates(chat):
    _, trajs = _run(
        chat,
        ["x</think><answer>Left</answer>"] * 5,
        EpisodeLimits(max_context_tokens=len_first(chat) + 150, max_new_tokens=100),
        n=1,
    )
    assert trajs[0].truncated_context and len(trajs[0].turns) == 1


def len_first(chat):
    from ragen_lit.agent.prompts import system_prompt, user_message

    env = FrozenLakeEnv.from_grid(GRID)
    obs, _ = env.reset(seed=0)
    return len(chat.first_prompt_ids(system_prompt(env.instruction, env.actions, 2), user_message(1, obs, 10)))


class _WaitingFrozenLake(FrozenLakeEnv):
    """FrozenLake whose steps wait 0.3 s, as a sandboxed program does (`steps_wait`)."""

    steps_wait = True
    lock = threading.Lock()
    running = 0
    most_at_once = 0

    def step(self, action):
        cls = type(self)
        with cls.lock:
            cls.running += 1
            cls.most_at_once = max(cls.most_at_once, cls.running)
        time.sleep(0.3)
        try:
            return super().step(action)
        finally:
            with cls.lock:
                cls.running -= 1


def test_envs_whose_steps_wait_are_stepped_together_with_the_same_result(chat):
    replies = ["go</think><answer>Right || Right</answer>", "go</think><answer>Down</answer>"]
    limits = EpisodeLimits(max_turns=2)
    waiting = rollout(
        ScriptedEngine(chat, replies),
        partial(_WaitingFrozenLake.from_grid, GRID),
        [0] * 6,
        [0] * 6,
        chat,
        limits,
        SamplingParams(seed=1),
    )
    assert _WaitingFrozenLake.most_at_once == 6  # every episode's step ran at once, not one after another
    _, plain = _run(chat, replies, limits=limits, n=6)
    for a, b in zip(waiting, plain):
        assert a.token_ids == b.token_ids and a.reward == b.reward and a.success == b.success
        assert [t.actions for t in a.turns] == [t.actions for t in b.turns]


def test_a_rollout_with_kept_turns_samples_what_full_prefills_sample(chat):
    """The engine's kept turns (`HFEngine(reuse_turns=True)`, on the graph cache's fast path): the rollout's next
    prompt is its last prompt, the sampled ids and the new message, token for token, so the engine continues every
    kept row from turn 2 on (prefilling only the new tokens), and the episodes are the ones an engine that prefills
    whole conversations samples (a random model, temperature 1)."""
    import torch
    import transformers

    from ragen_lit.engines.hf import HFEngine

    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(
            vocab_size=len(chat.tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).float()
    limits = EpisodeLimits(max_turns=3, max_new_tokens=10)
    make = partial(FrozenLakeEnv.from_grid, GRID)
    runs = {}
    for reuse in (True, False):
        engine = HFEngine(model, pad_token_id=chat.tokenizer.pad_token_id, cache="graph", reuse_turns=reuse)
        continued = []
        original = engine._prefill_kept
        engine._prefill_kept = lambda *args, seen=continued, fill=original: seen.append(len(args[2])) or fill(*args)
        runs[reuse] = (
            rollout(engine, make, [0, 1, 2, 3], [0, 0, 1, 1], chat, limits, SamplingParams(seed=3)),
            continued,
        )
    (kept, continued), (whole, _) = runs[True], runs[False]
    assert [t.token_ids for t in kept] == [t.token_ids for t in whole]
    assert continued and continued[0] == 4  # turn 2 continued all four episodes
