"""The README and docs/ name only files that exist, link only docs that exist, show only launch.py
commands that still parse, and CI runs the README's test command."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
DOCS = {path.name: path.read_text() for path in sorted((REPO / "docs").glob("*.md"))}
_PATH = r"`((?:actors|learner|envhub|common|configs|tests|\.ci)/[\w./-]+\.(?:py|yaml|txt|sh))`"


def _missing_paths(text: str) -> list[str]:
    paths = set(re.findall(_PATH, text)) | set(re.findall(r"(configs/\w+\.yaml)", text))
    return sorted(p for p in paths if not (REPO / p).exists() and "guess" not in p)


@pytest.mark.parametrize("name", ["README.md", *DOCS])
def test_every_path_a_page_names_exists(name):
    text = README if name == "README.md" else DOCS[name]
    assert not _missing_paths(text), f"{name} names files that do not exist: {_missing_paths(text)}"


def test_the_readme_names_enough_paths_to_be_checked():
    assert len(set(re.findall(_PATH, README))) > 20


def test_every_doc_the_readme_links_exists_and_every_doc_is_linked():
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", README))
    assert linked <= set(DOCS), f"README links docs that do not exist: {sorted(linked - set(DOCS))}"
    assert set(DOCS) <= linked, f"docs the README does not link: {sorted(set(DOCS) - linked)}"


def _launch_commands() -> list[list[str]]:
    blocks = re.findall(r"```(?:bash)?\n(.*?)\n```", README, re.S)
    lines = [line.split("#")[0].split() for block in blocks for line in block.splitlines()]
    return [words[words.index("launch.py") + 1:] for words in lines if "launch.py" in words
            and "--ray-address" not in words and "auto" not in words]


@pytest.mark.parametrize("args", _launch_commands(), ids=" ".join)
def test_every_launch_command_the_readme_shows_still_parses(args, tmp_path):
    # --dry-run plans and prints without starting anything: a flag or key the code no longer
    # has, or a config file that is gone, fails it.
    args = [a for a in args if a != "--dry-run"]
    proc = subprocess.run([sys.executable, "launch.py", *args, "--dry-run", "--output-dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "placement plan" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    test_command = next(c for c in commands if "pytest" in c)
    ci = (REPO / ".ci" / "run").read_text()
    for part in test_command.split("&&"):
        assert part.strip() in ci, f"CI does not run {part.strip()!r}"


def test_the_readme_example_environment_registers_and_plays(tmp_path, monkeypatch):
    import asyncio

    from envhub import registry

    blocks = re.findall(r"```python\n(.*?)\n```", README, re.S)
    module, registration = (next(b for b in blocks if b.startswith(f"# envhub/envs/{name}"))
                            for name in ("guess", "__init__"))
    (tmp_path / "readme_guess.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.list_specs()  # load the built-ins first, so the copy below holds them
    monkeypatch.setattr(registry, "_specs", dict(registry._specs))  # the example's id leaves with the test
    exec(registration.replace("envhub.envs.guess:", "readme_guess:"), {"register": registry.register})

    async def play() -> list[float]:
        env, low, high, rewards = registry.make("guess-v0"), 1, 10, []
        await env.reset(registry.task_ids("guess-v0", "test")[0], seed=0)
        for _ in range(registry.spec("guess-v0").max_turns):
            guess = (low + high) // 2
            result = await env.step(f"guess {guess}")
            rewards.append(result.reward)
            if result.terminated:
                break
            low, high = (guess + 1, high) if "higher" in result.observation else (low, guess - 1)
        await env.close()
        return rewards

    rewards = asyncio.run(play())
    assert rewards[-1] == 1.0 and len(rewards) <= 4, rewards  # binary search finds 1..10 in 4 guesses
