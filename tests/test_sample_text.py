"""Sample trajectories as text: the right episodes are picked, and agent and env text stay apart."""

import numpy as np

from common.protocol import Trajectory
from common.tiny_model import load_tiny_tokenizer
from learner.sample_text import best_and_worst, samples_markdown


def episode(tokenizer, env_id: str, reward: float, turns: list[tuple[str, str]], task_id: str = "7") -> Trajectory:
    """An episode whose turns are (observation, action) pairs, tokenized as the actor would."""
    ids, mask, spans = [], [], []
    for observation, action in turns:
        ids += tokenizer.encode(observation, add_special_tokens=False)
        mask += [0] * (len(ids) - len(mask))
        start = len(ids)
        ids += tokenizer.encode(action, add_special_tokens=False)
        mask += [1] * (len(ids) - start)
        spans += [start, len(ids)]
    n = len(ids)
    return Trajectory(lease_id="l", group_id="g", env_id=env_id, task_id=task_id, actor_id=0, episode_index=0,
                      group_size=1, token_ids=np.array(ids, "<i4"), loss_mask=np.array(mask, "u1"),
                      behavior_logprobs=np.zeros(n, "<f4"), token_versions=np.full(n, 3, "<i4"),
                      turn_spans=np.array(spans, "<i4"), reward=reward, success=reward == 1.0,
                      num_turns=len(turns), turn_cap=4, finish_reason="terminated", terminated=True,
                      truncated=False, status="ok")


def test_best_and_worst_are_picked_per_env():
    tok = load_tiny_tokenizer()
    a_good = episode(tok, "a-v0", 1.0, [("obs", "act")], task_id="good")
    a_bad = episode(tok, "a-v0", 0.0, [("obs", "act")], task_id="bad")
    a_mid = episode(tok, "a-v0", 0.5, [("obs", "act")], task_id="mid")
    b_only = episode(tok, "b-v0", 0.2, [("obs", "act")])
    picked = best_and_worst([a_mid, a_bad, b_only, a_good])
    assert picked["a-v0"] == (a_good, a_bad)
    assert picked["b-v0"] == (b_only, b_only)


def test_agent_tokens_are_code_blocks_and_env_text_is_quoted():
    tok = load_tiny_tokenizer()
    ep = episode(tok, "a-v0", 1.0, [("You see a key.", "take key"), ("Door opens.", "go north")])
    markdown = samples_markdown([ep], tok)["samples/a-v0"]
    assert "```\ntake key\n```" in markdown and "```\ngo north\n```" in markdown
    assert "> You see a key." in markdown and "> Door opens." in markdown
    assert "reward 1.000" in markdown and "turns 2/4" in markdown and "policy versions 3" in markdown
