from ragen_lit.agent.parsing import parse_response
from ragen_lit.agent.prompts import assistant_response, format_reward, user_message


def test_well_formed_single_action():
    p = parse_response("I am at (0, 0), goal right.</think><answer>Right</answer>", max_actions=2)
    assert p.reasoning == "I am at (0, 0), goal right."
    assert p.answer == "Right"
    assert p.actions == ["Right"]


def test_two_actions_and_whitespace_between_tags():
    p = parse_response(" go </think>\n <answer> Down || Right </answer>", max_actions=2)
    assert p.reasoning == "go"
    assert p.actions == ["Down", "Right"]
    assert p.extra_actions == 0


def test_extra_actions_are_truncated_and_counted():
    p = parse_response("r</think><answer>Up || Up || Left</answer>", max_actions=2)
    assert p.actions == ["Up", "Up"]
    assert p.extra_actions == 1


def test_missing_tags_give_nothing():
    for text in ["Right", "reason<answer>Right</answer>", "reason</think>Right", "reason</think><answer>Right", ""]:
        p = parse_response(text, max_actions=2)
        assert p.reasoning is None and p.actions == [], text


def test_nested_think_is_malformed():
    p = parse_response("a<think>b</think><answer>Up</answer>", max_actions=2)
    assert p.reasoning is None and p.actions == []


def test_empty_answer_and_empty_parts():
    p = parse_response("x</think><answer> || </answer>", max_actions=2)
    assert p.reasoning == "x" and p.actions == []


def test_only_first_answer_is_used():
    p = parse_response("x</think><answer>Up</answer><answer>Down</answer>", max_actions=2)
    assert p.actions == ["Up"]


def test_assistant_response_round_trips():
    text = assistant_response("plan", ["Left", "Down"])
    p = parse_response(text, max_actions=2)
    assert p.reasoning == "plan" and p.actions == ["Left", "Down"]


def test_reward_formatting():
    assert [format_reward(x) for x in (1.0, 0.0, -0.1, 0.9, -0.0, 10.0, 0.25)] == [
        "1",
        "0",
        "-0.1",
        "0.9",
        "0",
        "10",
        "0.25",
    ]


def test_user_message_mentions_reward_and_warning_only_when_given():
    first = user_message(1, "obs", 10)
    assert "Reward" not in first and "No valid action" not in first and "Turn 1:" in first
    later = user_message(2, "obs", 8, previous_reward=-0.1, previous_invalid=True)
    assert later.startswith("Reward: -0.1\nNo valid action")


def test_reasoning_tokens_are_counted_as_sampled():
    """The reasoning's own tokens, whatever split the policy sampled: the count up to the token in which </think>
    begins; None where no token boundary separates the two, or without </think>."""
    from ragen_lit.agent.parsing import reasoning_token_count

    pieces = [" [your thought", "s", "]", " ", "</think>", "<answer>", "Up", "</answer>"]

    def decode(ids):
        return "".join(pieces[i] for i in ids)

    ids = list(range(len(pieces)))
    assert reasoning_token_count(decode, ids, decode(ids)) == 4  # " [your thoughts] ", the space included
    glued = [" go", "</thi", "nk><answer>Up</answer>"]  # </think> starts at a token boundary, ends inside one
    assert reasoning_token_count(lambda i: "".join(glued[k] for k in i), [0, 1, 2], "".join(glued)) == 1
    inside = [" g", "o</think>", "<answer>Up</answer>"]  # </think> begins inside a token carrying reasoning text
    assert reasoning_token_count(lambda i: "".join(inside[k] for k in i), [0, 1, 2], "".join(inside)) is None
    assert reasoning_token_count(decode, [0, 1, 2], decode([0, 1, 2])) is None  # no </think>
    assert reasoning_token_count(decode, [4, 5, 6, 7], decode([4, 5, 6, 7])) == 0  # empty reasoning
