"""The trajectory viewer (``envhub/ui``) against a real envhub server and a real run folder.

The run folder is recorded the way a live run records it: real environments played through
``ChatTokenBuffer`` with the tiny model's tokenizer, every episode written as a ``Trajectory``
frame by ``Recorder``, and the learner's ``TrainedLog`` writing what two updates trained on (GRPO
advantages from ``learner/advantages.py``). One test also checks the record a real launched run's
learner writes (the session ``smoke_run``). The click-through runs in headless Chromium.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest

from common import protocol
from common.chat import ChatTokenBuffer
from common.config import load_config, write_resolved
from common.config.envhub import EnvhubConfig
from common.models import default_cache_dir, load_tokenizer, resolve_model
from common.protocol import TaskLease, TrainedSample, Trajectory
from common.recording import Recorder, read_messages
from envhub import registry
from envhub.ui.runs import RunCatalog
from learner.advantages import grpo_advantages, sequence_to_token_advantages
from learner.batching import collate
from learner.group import Group
from learner.trained_log import TrainedLog
from tests.servers import running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

RUN = "viewer-run"
SYSTEM_PROMPT = "You are an agent. Reply with one action."
XSS_ACTION = '<img src=x onerror="window.__xss=1">go kitchen'
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def keydoor_solution(first_observation: str) -> list[str]:
    key_room = re.search(r"A key jingles in the (\w+)", first_observation).group(1)
    return [f"go {key_room}", "take key", "go hall", "open door"]


# Per lease: id, env, task, purpose, the learner step that trains it (None: never), and one
# script per episode (a list of actions, or a function of the first observation).
LEASES = [
    ("lease-a", "keydoor-v0", "3", "train", 1, [keydoor_solution, ["look around", XSS_ACTION, "go hall"]]),
    ("lease-b", "textcraft-v0", "0", "train", 2,
     [["get 1 acacia log", "craft 4 acacia planks using 1 acacia log"], ["inventory", "inventory"]]),
    ("lease-c", "keydoor-v0", "7", "train", None, [keydoor_solution, keydoor_solution]),  # dropped as stale
    ("lease-d", "keydoor-v0", "10000", "eval", None, [["go hall"], keydoor_solution]),
]


async def play(env_id: str, task_id: str, script, tokenizer, version: int) -> dict:
    """One episode through a real env and the real token buffer, as an actor records it."""
    env = registry.make(env_id)
    observation, _ = await env.reset(task_id, 0)
    actions = script(observation) if callable(script) else script
    buffer, reward, ending = ChatTokenBuffer(tokenizer, SYSTEM_PROMPT), 0.0, None
    buffer.start(observation)
    for action in actions:
        ids = tokenizer(action, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        buffer.append_generated(ids, [-0.25] * len(ids), [version] * len(ids))
        result = await env.step(action)
        reward += result.reward
        if result.terminated or result.truncated:
            ending = result
            break
        buffer.append_observation(result.observation)
    await env.close()
    arrays = buffer.as_arrays()
    return dict(token_ids=arrays["token_ids"], loss_mask=arrays["loss_mask"], behavior_logprobs=arrays["logprobs"],
                token_versions=arrays["versions"], turn_spans=arrays["turn_spans"], reward=min(reward, 1.0),
                success=bool(ending and ending.info.get("success")), terminated=bool(ending and ending.terminated),
                truncated=ending is None, finish_reason="terminated" if ending else "turn_cap", status="ok",
                num_turns=len(arrays["turn_spans"]), turn_cap=len(actions), actions=actions)


def record_run(run_dir: Path, tokenizer) -> tuple[list[Trajectory], list[list[str]]]:
    """Write config.yaml, trajectories.msgpack and trained.msgpack; returns the episodes and actions."""
    write_resolved(load_config(None, ["--model.name", "tiny", "--rollout.envs", "[keydoor-v0, textcraft-v0]"]),
                   run_dir / "config.yaml")
    recorder = Recorder(run_dir / "trajectories" / "trajectories.msgpack")
    trained_log = TrainedLog(run_dir / "trajectories")
    episodes, actions = [], []
    for version, (lease_id, env_id, task_id, purpose, step, scripts) in enumerate(LEASES):
        lease = TaskLease(lease_id=lease_id, group_id=f"group-{lease_id}", env_id=env_id, task_id=task_id, seed=0,
                          group_size=len(scripts), turn_cap=4, max_episode_tokens=1024, policy_version=version,
                          deadline_unix_s=0.0, purpose=purpose)
        group = Group(lease)
        for index, script in enumerate(scripts):
            played = asyncio.run(play(env_id, task_id, script, tokenizer, version))
            actions.append(played.pop("actions"))
            episode = Trajectory(lease_id=lease_id, group_id=lease.group_id, env_id=env_id, task_id=task_id,
                                 actor_id=0, episode_index=index, group_size=len(scripts), purpose=purpose, **played)
            recorder.write(protocol.encode(episode))
            group.episodes.append(episode)
            episodes.append(episode)
        if step is not None:
            batch = collate([group])
            advantages = sequence_to_token_advantages(grpo_advantages(batch.rewards, batch.group_index, True),
                                                      batch.loss_mask)
            trained_log.record(batch, advantages, step)
    recorder.close()
    trained_log.close()
    return episodes, actions


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model("tiny", default_cache_dir()))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, tokenizer):
    runs_dir = tmp_path_factory.mktemp("viewer-runs")
    episodes, actions = record_run(runs_dir / RUN, tokenizer)
    return runs_dir, episodes, actions


@pytest.fixture(scope="module")
def hub(recorded):
    with running_hub(EnvhubConfig(runs_dir=str(recorded[0]))) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            yield client


def trained_steps() -> list[int | None]:
    return [step for *_, step, scripts in LEASES for _ in scripts]


# ---------------------------------------------------------------------------------- JSON API


def test_runs_are_listed_with_their_model_and_envs(hub):
    runs = hub.get("/ui/api/runs").json()["runs"]
    assert [run["name"] for run in runs] == [RUN]
    assert runs[0]["model"] == "tiny" and runs[0]["envs"] == ["keydoor-v0", "textcraft-v0"]
    assert runs[0]["has_trained_record"] and runs[0]["trajectory_bytes"] > 0


def test_filters_by_env_learner_step_success_and_purpose(hub, recorded):
    _, episodes, _ = recorded

    def numbers(**params) -> list[int]:
        page = hub.get(f"/ui/api/runs/{RUN}/trajectories", params=params).json()
        assert page["total"] == len(page["items"])  # one page here
        return [item["number"] for item in page["items"]]

    everything = hub.get(f"/ui/api/runs/{RUN}/trajectories").json()
    assert everything["count"] == len(episodes) and everything["envs"] == ["keydoor-v0", "textcraft-v0"]
    assert everything["steps"] == [1, 2]
    assert [item["learner_step"] for item in everything["items"]] == trained_steps()
    assert numbers(env="textcraft-v0") == [i for i, e in enumerate(episodes) if e.env_id == "textcraft-v0"]
    assert numbers(success="true") == [i for i, e in enumerate(episodes) if e.success]
    assert numbers(success="false") == [i for i, e in enumerate(episodes) if not e.success]
    assert numbers(step="1") == [0, 1] and numbers(step="2") == [2, 3]
    assert numbers(step="none") == [4, 5, 6, 7]
    assert numbers(purpose="eval") == [6, 7]
    assert numbers(env="keydoor-v0", success="true", step="none") == [i for i in (4, 5, 6, 7) if episodes[i].success]


def test_pages_through_a_run(hub, recorded):
    page = hub.get(f"/ui/api/runs/{RUN}/trajectories", params={"offset": 3, "limit": 3}).json()
    assert page["total"] == len(recorded[1]) and [item["number"] for item in page["items"]] == [3, 4, 5]
    assert hub.get(f"/ui/api/runs/{RUN}/trajectories", params={"limit": 100_000}).status_code == 422


def test_trajectory_turns_and_tokens_match_the_recording(hub, recorded, tokenizer):
    _, episodes, actions = recorded
    for number, episode in enumerate(episodes):
        data = hub.get(f"/ui/api/runs/{RUN}/trajectories/{number}").json()
        assert len(data["turns"]) == episode.num_turns == len(episode.turn_spans)
        blocks = [block for turn in data["turns"] for block in (turn["observation"], turn["action"])]
        blocks += [data["tail"]] if data["tail"] else []
        assert sum((block["ids"] for block in blocks), []) == episode.token_ids.tolist()  # nothing lost or doubled
        assert sum((block["loss_mask"] for block in blocks), []) == episode.loss_mask.tolist()
        for turn, (start, end), action in zip(data["turns"], episode.turn_spans.tolist(), actions[number]):
            assert turn["action"]["ids"] == episode.token_ids[start:end].tolist()
            assert turn["action"]["text"] == action  # decoded as the actor decoded it for the env
            assert "".join(turn["observation"]["pieces"]) == turn["observation"]["text"]
        assert data["turns"][-1]["reward"] == episode.reward
        assert (data["tail"] is not None) == (episode.finish_reason == "turn_cap")  # the unanswered observation
        assert data["tokenizer"]["error"] == ""


def test_trained_episodes_show_their_step_and_grpo_advantage(hub, recorded):
    _, episodes, _ = recorded
    for number, step in enumerate(trained_steps()):
        data = hub.get(f"/ui/api/runs/{RUN}/trajectories/{number}").json()
        if step is None:
            assert data["trained"] is None and all(turn["advantage"] is None for turn in data["turns"])
            continue
        group = [e for e in episodes if e.lease_id == episodes[number].lease_id]
        rewards = [e.reward for e in group]
        mean = sum(rewards) / len(rewards)
        std = (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5
        expected = (episodes[number].reward - mean) / (std + 1e-6) if std > 0 else 0.0
        assert data["trained"]["learner_step"] == step
        assert data["trained"]["advantage"] == pytest.approx(expected, abs=1e-5)
        assert all(turn["advantage"] == pytest.approx(expected, abs=1e-5) for turn in data["turns"])
        action_advantages = [a for turn in data["turns"] for a in turn["action"]["advantages"]]
        assert action_advantages == pytest.approx([expected] * int(episodes[number].loss_mask.sum()), abs=1e-5)


def test_bad_requests_are_clear_errors(hub, recorded):
    for name in ("no-such-run", "..", "%2e%2e", "viewer-run%2F..%2F.."):
        assert hub.get(f"/ui/api/runs/{name}/trajectories").status_code == 404, name
    assert hub.get(f"/ui/api/runs/{RUN}/trajectories", params={"step": "abc"}).status_code == 422
    missing = hub.get(f"/ui/api/runs/{RUN}/trajectories/{len(recorded[1])}")
    assert missing.status_code == 404 and "no number" in missing.json()["detail"]
    assert hub.get("/ui/static/..%2Fruns.py").status_code == 404


def test_a_live_run_shows_appended_episodes_and_waits_for_a_torn_record(recorded, tmp_path):
    runs_dir, episodes, _ = recorded
    shutil.copytree(runs_dir / RUN, tmp_path / RUN)
    catalog = RunCatalog(tmp_path)
    assert len(catalog.index(RUN).rows) == len(episodes)
    stream = tmp_path / RUN / "trajectories" / "trajectories.msgpack"
    frames = stream.read_bytes()
    first = frames[: 4 + int.from_bytes(frames[:4], "little")]
    with open(stream, "ab") as f:
        f.write(first[:-3])  # a record being written: not shown yet
    assert len(catalog.index(RUN).rows) == len(episodes)
    with open(stream, "ab") as f:
        f.write(first[-3:])
    rows = catalog.index(RUN).rows
    assert len(rows) == len(episodes) + 1 and rows[-1].lease_id == episodes[0].lease_id


# ---------------------------------------------------------------------------------- the learner's record


def test_a_launched_runs_learner_records_what_it_trained_on(smoke_run):
    run_dir, _ = smoke_run
    stream = read_messages(run_dir / "trajectories" / "trajectories.msgpack")
    episodes = {(m.lease_id, m.episode_index): m for m in stream if isinstance(m, Trajectory)}
    trained = [m for m in read_messages(run_dir / "trajectories" / "trained.msgpack") if isinstance(m, TrainedSample)]
    assert {sample.learner_step for sample in trained} == {1, 2, 3, 4}  # configs/smoke.yaml: max_steps 4
    for sample in trained:
        episode = episodes[(sample.lease_id, sample.episode_index)]
        assert episode.status == "ok" and episode.purpose == "train"
        assert len(sample.token_advantages) == int(episode.loss_mask.sum())
        assert sample.advantage == pytest.approx(float(sample.token_advantages.mean()), abs=1e-6)
    with running_hub(EnvhubConfig(runs_dir=str(run_dir.parent))) as url:
        page = httpx.get(f"{url}/ui/api/runs/{run_dir.name}/trajectories", params={"limit": 1000}).json()
    steps = {(item["lease_id"], item["episode_index"]): item["learner_step"] for item in page["items"]}
    assert all(steps[(s.lease_id, s.episode_index)] == s.learner_step for s in trained)
    assert all(item["learner_step"] is None for item in page["items"] if item["purpose"] == "eval")


# ---------------------------------------------------------------------------------- the page, in Chromium


@pytest.fixture(scope="module")
def browser_page(hub):
    from playwright import sync_api  # a dependency; .ci/install puts Debian's chromium at /usr/bin/chromium

    assert Path("/usr/bin/chromium").exists(), "install Debian's chromium (bash .ci/install does)"
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(15_000)
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        yield page, sync_api.expect, errors
        browser.close()


def token_ids(page, selector: str) -> list[int]:
    return [int(x) for x in page.eval_on_selector_all(selector, "spans => spans.map(s => s.dataset.id)")]


def test_click_through_runs_filters_a_trajectory_and_playing_keydoor(browser_page, hub, recorded):
    page, expect, errors = browser_page
    _, episodes, actions = recorded
    page.goto(f"{hub.base_url}/ui")
    page.click(f'#runs-table tr[data-run="{RUN}"]')
    expect(page.locator("#match-count")).to_have_text(f"{len(episodes)} of {len(episodes)} trajectories")
    expect(page.locator("#trajectories-table tbody tr .learner-step")).to_have_text(
        [str(step) if step else "not trained" for step in trained_steps()])

    page.select_option("#filter-env", "keydoor-v0")
    keydoor = [i for i, e in enumerate(episodes) if e.env_id == "keydoor-v0"]
    expect(page.locator("#match-count")).to_have_text(f"{len(keydoor)} of {len(episodes)} trajectories")
    page.select_option("#filter-step", "1")
    expect(page.locator("#trajectories-table tbody tr")).to_have_count(2)
    page.select_option("#filter-success", "true")
    expect(page.locator("#trajectories-table tbody tr")).to_have_count(1)

    page.click('#trajectories-table tr[data-number="0"]')  # lease-a's solved episode, trained at step 1
    episode = episodes[0]
    expect(page.locator("#turns .turn")).to_have_count(episode.num_turns)
    expect(page.locator("#trajectory-summary")).to_contain_text("step 1, advantage 0.707")
    for turn, ((start, end), action) in enumerate(zip(episode.turn_spans.tolist(), actions[0]), start=1):
        card = f'#turns .turn[data-turn="{turn}"]'
        expect(page.locator(f"{card} .text.action")).to_have_text(action)
        assert token_ids(page, f"{card} .tok.act") == episode.token_ids[start:end].tolist()
        previous_end = episode.turn_spans[turn - 2][1] if turn > 1 else 0
        assert token_ids(page, f"{card} .tok.env") == episode.token_ids[previous_end:start].tolist()
    assert token_ids(page, "#turns .tok") == episode.token_ids.tolist()

    page.go_back()  # the filtered list, as it was
    expect(page.locator("#trajectories-table tbody tr")).to_have_count(1)
    page.select_option("#filter-success", "false")
    page.click('#trajectories-table tr[data-number="1"]')  # the episode whose action carries markup
    expect(page.locator('#turns .turn[data-turn="2"] .text.action')).to_have_text(XSS_ACTION)
    assert page.locator("#turns img").count() == 0 and page.evaluate("window.__xss") is None
    expect(page.locator("#turns .turn.tail")).to_have_count(1)

    page.click("#nav-play")
    page.select_option("#play-env", "keydoor-v0")
    page.fill("#play-task", "42")
    page.click("#play-reset-button")
    first_observation = page.locator("#play-log .entry.observation").first
    expect(first_observation).to_contain_text("A key jingles in the")
    for action in keydoor_solution(first_observation.inner_text()):
        page.fill("#play-action", action)
        page.press("#play-action", "Enter")
        expect(page.locator("#play-log .entry.action").last).to_have_text(action)
    expect(page.locator("#play-status")).to_have_text("reward 1 · success true · terminated · turn 4")
    expect(page.locator("#play-action")).to_be_disabled()  # the episode ended: the page closes the session
    deadline_s = time.monotonic() + 10
    while hub.get("/health").json()["sessions"] and time.monotonic() < deadline_s:
        time.sleep(0.05)
    assert hub.get("/health").json()["sessions"] == 0
    assert errors == []
