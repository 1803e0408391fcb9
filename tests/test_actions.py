"""Action extraction in the Thought/Action style."""

from envhub.actions import MalformedAction, extract_action


def test_takes_the_line_after_the_last_action_marker():
    reply = "Thought: I need planks.\nAction: get 1 oak log\n"
    assert extract_action(reply) == "get 1 oak log"
    assert extract_action("Thought: x Action: a\nThought: y\nACTION:\n  craft 4 oak planks using 1 oak log\n") == \
        "craft 4 oak planks using 1 oak log"


def test_missing_or_empty_action_gives_feedback_not_an_exception():
    missing = extract_action("I think I should get a log")
    assert isinstance(missing, MalformedAction) and "Action:" in missing.feedback
    empty = extract_action("Thought: hmm\nAction:   \n")
    assert isinstance(empty, MalformedAction) and "empty" in empty.feedback


def test_plain_replies_without_marker_when_allowed():
    assert extract_action("go kitchen\nextra", require_marker=False) == "go kitchen"


def test_oversized_reply_is_rejected_with_the_limit():
    result = extract_action("Action: " + "x" * 50, max_chars=20)
    assert isinstance(result, MalformedAction) and "20" in result.feedback
