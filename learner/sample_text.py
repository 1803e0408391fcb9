"""Sample trajectories as tensorboard text: the best and the worst episode per env, every K steps.

Scalars say *that* reward moved; reading what the agent wrote says *why*. Each sample is the
decoded token stream, split at the turn boundaries the actor recorded: env text (loss mask 0)
as quoted blocks, the agent's sampled tokens (loss mask 1) as code blocks, so the two never
blur together. The learner sees tokens only; this is the one place it decodes them, for people.
"""

from __future__ import annotations

from collections import defaultdict

from common.protocol import Trajectory

MAX_CHARS_PER_SEGMENT = 1500
"""A long observation is cut in the middle (tensorboard renders the text whole)."""


def best_and_worst(episodes: list[Trajectory]) -> dict[str, tuple[Trajectory, Trajectory]]:
    """Per env id: (best, worst) by reward; ties go to success, then to the fewer turns."""
    by_env: dict[str, list[Trajectory]] = defaultdict(list)
    for episode in episodes:
        by_env[episode.env_id].append(episode)

    def rank(episode: Trajectory) -> tuple:
        return episode.reward, episode.success, -episode.num_turns

    return {env_id: (max(group, key=rank), min(group, key=rank)) for env_id, group in sorted(by_env.items())}


def render(episode: Trajectory, tokenizer, label: str) -> str:
    """One episode as markdown: a header line, then its segments in order."""
    header = (f"**{label}** · task `{episode.task_id}` · reward {episode.reward:.3f} · "
              f"success {episode.success} · turns {episode.num_turns}/{episode.turn_cap} · "
              f"{episode.finish_reason or '-'} · status {episode.status} · "
              f"policy versions {_versions(episode)}")
    lines = [header, ""]
    for is_action, start, end in _segments(episode):
        text = _clip(tokenizer.decode(episode.token_ids[start:end].tolist()))
        if is_action:
            lines += ["```", text.replace("```", "'''"), "```"]
        else:
            lines += ["> " + line for line in text.splitlines() or [""]]
        lines.append("")
    if episode.error:
        lines.append(f"error: {episode.error}")
    return "\n".join(lines)


def samples_markdown(episodes: list[Trajectory], tokenizer) -> dict[str, str]:
    """Tag -> markdown, one tag per env: ``samples/<env_id>`` with its best and worst episode."""
    out = {}
    for env_id, (best, worst) in best_and_worst(episodes).items():
        out[f"samples/{env_id}"] = render(best, tokenizer, "best") + "\n\n---\n\n" + render(worst, tokenizer, "worst")
    return out


def _segments(episode: Trajectory) -> list[tuple[bool, int, int]]:
    """(is the agent's, start, end) runs covering the whole token stream, from ``turn_spans``."""
    segments, cursor = [], 0
    for start, end in episode.turn_spans.reshape(-1, 2).tolist():
        if start > cursor:
            segments.append((False, cursor, start))
        segments.append((True, start, end))
        cursor = end
    if cursor < len(episode.token_ids):
        segments.append((False, cursor, len(episode.token_ids)))
    return segments


def _versions(episode: Trajectory) -> str:
    sampled = episode.token_versions[episode.loss_mask.astype(bool)]
    if len(sampled) == 0:
        return "-"
    low, high = int(sampled.min()), int(sampled.max())
    return str(low) if low == high else f"{low}-{high}"


def _clip(text: str) -> str:
    if len(text) <= MAX_CHARS_PER_SEGMENT:
        return text
    half = MAX_CHARS_PER_SEGMENT // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"
