"""The README names only files that exist, and CI runs the README's test command."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_every_path_the_readme_names_exists():
    paths = set(re.findall(r"`((?:actors|learner|envhub|common|configs|tests|\.ci)/[\w./-]+\.(?:py|yaml|txt))`",
                           README))
    paths |= {p for p in re.findall(r"(configs/\w+\.yaml)", README)}
    assert len(paths) > 20
    missing = sorted(p for p in paths if not (REPO / p).exists() and "guess" not in p)
    assert not missing, f"README names files that do not exist: {missing}"


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    test_command = next(c for c in commands if "pytest" in c)
    ci = (REPO / ".ci" / "run").read_text()
    for part in test_command.split("&&"):
        assert part.strip() in ci, f"CI does not run {part.strip()!r}"
