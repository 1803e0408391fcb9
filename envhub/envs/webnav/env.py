"""``webnav-v0``: web navigation in a real headless Chromium, WebArena's way.

1. reset: lease a browser context from the process's pool; for offline tasks open a fresh site
   session (its own SQLite state, its cookie in the context); open the task's start URL(s).
2. Observation: the current tab's accessibility tree with element ids, the URL, the objective
   and the previous action (WebArena's prompt layout); the first one also lists the actions.
3. step: parse one action of WebArena's grammar and run it in the browser; a bad action is a
   wasted turn with feedback. ``stop [answer]`` ends the episode: the task's evaluators score
   the answer and the final state; reward = score in [0, 1] (AgentGym-RL's training reward: the
   last step's, and every other step's is 0), ``info["score"]`` = the score so far.
   Dialect ``agentgym`` (default; agentgym_dialect.py): AgentGym's client and server, i.e. the
   action is the reply's first ```block```, AgentGym's messages replace the whole observation
   when it has none or it does not parse, the URL line shows WebArena's real-world site URLs,
   PREVIOUS ACTION is WebArena's action description, stop's observation is the page once more,
   success = score > 0 (AgentGym-RL's "Pass"). Dialect ``lenient``: ``Action:`` lines too,
   feedback inside the page observation, success = score 1.
4. A crashed page or browser raises: envhub closes the session and reports the episode as
   an env error. close: the context goes back to the pool (cleared), the site state is deleted.

Options: envhub/envs/webnav/options.py. Tasks: envhub/envs/webnav/tasks.py (WebArena's format),
offline ones in offline_tasks.py, on the sites of envhub/sites; each source's list: catalog.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from envhub.base import ConversationStart, Environment, StepResult
from envhub.envs.webnav import agentgym_dialect as agentgym
from envhub.envs.webnav.actions import ACTION_HELP, BadAction, WebAction, parse_reply
from envhub.envs.webnav.browser import PoolSettings, browser_thread
from envhub.envs.webnav.catalog import TaskCatalog, catalog_for
from envhub.envs.webnav.evaluators import evaluate
from envhub.envs.webnav.observation import truncate
from envhub.envs.webnav.options import WebNavOptions
from envhub.envs.webnav.tabs import BrowserTabs, TabSettings
from envhub.envs.webnav.tasks import WebTask, resolve
from envhub.envs.webnav.worked_example import WORKED_EXAMPLE
from envhub.options import OptionsError, parse_options

INSTRUCTION = ("You are an autonomous web agent in a browser. Each observation shows the current tab as an "
               "accessibility tree, one element per line as [id] role 'name', followed by the URL, the objective "
               f"and your previous action. Reply with one action per turn. {ACTION_HELP}")


class WebNavEnv(Environment):
    """One browser session per episode; see the module docstring."""

    # Wins task 0 of the offline tasks (the price of the Wireless Optical Mouse) after two scrolls;
    # AgentGym's grammar, which the lenient dialect reads too.
    example_actions = ("Let's think step-by-step. In summary, the next action I will perform is ```scroll [down]```",
                       "```scroll [up]```", "In summary, the next action I will perform is ```stop [$159.95]```")

    def __init__(self, **options: Any) -> None:
        self.options = parse_options(WebNavOptions, options, "webnav-v0")
        self.catalog: TaskCatalog = catalog_for(self.options)
        self._runtime = browser_thread()
        self._tabs: BrowserTabs | None = None
        self._task: WebTask | None = None
        self._site_token: str | None = None
        self._site_urls: dict[str, str] = {}
        self._last_tree, self._last_url, self._previous_action, self._done = "", "", "None", True

    @classmethod
    def conversation_start(cls, **options: Any) -> ConversationStart:
        """agentgym: AgentGym's WebArena instruction and its "Ok.", and one worked example of our own
        (worked_example.py), off by default (~900 tokens); lenient: this project's instruction."""
        if parse_options(WebNavOptions, options, "webnav-v0").dialect == "agentgym":
            return ConversationStart(agentgym.INSTRUCTION, acknowledgement="Ok.", examples=(WORKED_EXAMPLE,))
        return ConversationStart(INSTRUCTION)

    @classmethod
    def task_splits(cls, **options: Any) -> dict[str, list[int]]:
        return catalog_for(parse_options(WebNavOptions, options, "webnav-v0")).split_ids

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        await self._end_episode()
        task = self.catalog.task(task_id)
        cookies = await self._open_sites(task)
        start_urls = [resolve(url.strip(), self._site_urls) for url in task.start_url.split(" |AND| ")]
        self._tabs = await self._runtime.call(self._open_tabs(start_urls, cookies))
        self._task, self._previous_action, self._done = task, "None", False
        observation = await self._observe()
        return observation, self._info(success=False)

    async def step(self, action: str) -> StepResult:
        if self._done or self._tabs is None or self._task is None:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        if self.options.dialect == "agentgym":
            return await self._agentgym_step(action)
        parsed = parse_reply(action)
        if isinstance(parsed, BadAction):
            invalid = f"{action.strip()[:200]!r} (invalid: {parsed.feedback})"
            return StepResult(self._render(self._last_tree, self._last_url, invalid), 0.0, False, False,
                              self._info(success=False) | {"action_parsed": False, "score": 0.0})
        if parsed.kind == "stop":
            return await self._stop(parsed.text)
        feedback = await self._runtime.call(self._tabs.execute(parsed))
        self._previous_action = parsed.render() + (f" (failed: {feedback})" if feedback else "")
        info = self._info(success=False) | {"action_parsed": True, "action_valid": not feedback, "score": 0.0}
        return StepResult(await self._observe(), 0.0, False, False, info)

    async def _agentgym_step(self, reply: str) -> StepResult:
        """AgentGym's WebArena client then server on one reply (agentgym_dialect.py)."""
        assert self._tabs is not None
        block = agentgym.first_block(reply)
        parsed = (agentgym.ParseFailure(agentgym.NO_BACKTICKS) if block is None
                  else agentgym.parse_agentgym_action(agentgym.to_local_urls(block, self._site_urls)))
        if isinstance(parsed, agentgym.ParseFailure):  # AgentGym's message is all the agent sees
            info = self._info(success=False) | {"action_parsed": False, "score": 0.0}
            return StepResult(parsed.message, 0.0, False, False, info)
        self._previous_action = agentgym.describe_action(parsed, agentgym.shown_element_lines(self._last_tree))
        if parsed.kind == "stop":
            observation = await self._observe()  # WebArena renders the page before its evaluator runs
            result = await self._stop(parsed.text)
            return dataclasses.replace(result, observation=observation,
                                       info=result.info | {"success": result.info["score"] > 0})
        feedback = await self._runtime.call(self._tabs.execute(parsed))
        info = self._info(success=False) | {"action_parsed": True, "action_valid": not feedback, "score": 0.0}
        return StepResult(await self._observe(), 0.0, False, False, info)

    async def close(self) -> None:
        await self._end_episode()

    async def _stop(self, answer: str) -> StepResult:
        assert self._tabs is not None and self._task is not None
        score, scores = await self._runtime.call(
            evaluate(self._task, answer, self._tabs, self._site_urls, self._site_token))
        self._done = True
        info = {**self._info(success=score >= 1.0), "score": score, "eval": scores, "answer": answer[:500],
                "action_parsed": True, "action_valid": True}
        return StepResult(f"The episode is over (stop [{answer[:200]}]). Score: {score:g}.", score, True, False, info)

    async def _open_sites(self, task: WebTask) -> list[dict[str, Any]]:
        """Site URLs for this episode, and the cookies its browser context starts with."""
        if self.options.task_source == "webarena":
            self._site_urls = dict(self.options.site_urls)
            missing = [site for site in task.sites if site not in self._site_urls]
            if missing:
                raise OptionsError(f"webnav-v0: task {task.task_id} needs site_urls for {missing}")
            return _login_cookies(self.options.auth_dir, task.storage_state)
        from envhub.sites.serving import hub_sites_url, standalone_sites_url
        from envhub.sites.store import SESSION_COOKIE, site_store

        base = self.options.sites_url if self.options.sites_url != "auto" else (
            hub_sites_url.get() or await asyncio.to_thread(standalone_sites_url))
        self._site_token = site_store().open_session()
        self._site_urls = {"shopping": f"{base}/shop", "shopping_admin": f"{base}/admin", "reddit": f"{base}/forum"}
        origin = f"{urlparse(base).scheme}://{urlparse(base).netloc}"
        return [{"name": SESSION_COOKIE, "value": self._site_token, "url": origin}, *_hub_token_cookie(origin)]

    async def _open_tabs(self, start_urls: list[str], cookies: list[dict[str, Any]]) -> BrowserTabs:
        """On the browser loop: a leased context with the start pages open, one tab each."""
        options = self.options
        pool = self._runtime.pool(PoolSettings(options.executable_path, options.headless, options.max_pages,
                                               options.max_idle_contexts, options.viewport_width,
                                               options.viewport_height))
        settings = TabSettings(options.max_tabs, options.page_wait_s, options.action_timeout_s,
                               options.navigation_timeout_s, options.viewport_only, options.settle_s)
        tabs = await BrowserTabs.open(pool, settings, cookies)
        tabs.allowed_sites = self._allowed_sites()
        try:
            for index, url in enumerate(start_urls):
                if index > 0:
                    await tabs.execute(WebAction("new_tab"))
                status = await tabs.goto(url)
                if status is not None and status >= 400:  # a broken site, not a task: an env error
                    raise RuntimeError(f"webnav-v0: start page {url} answered HTTP {status}")
        except BaseException:
            await tabs.close()
            raise
        return tabs

    def _allowed_sites(self) -> tuple[str, ...]:
        """Where goto may lead: the offline sites' own paths; a WebArena deployment's site origins."""
        if self.options.task_source == "offline":
            return tuple(url.rstrip("/") for url in self._site_urls.values())
        origins = {f"{urlparse(url).scheme}://{urlparse(url).netloc}" for url in self._site_urls.values()}
        return tuple(sorted(origins))

    async def _observe(self) -> str:
        assert self._tabs is not None
        tree, self._last_url = await self._runtime.call(self._tabs.observe())
        self._last_tree = truncate(tree, self.options.max_observation_chars)
        return self._render(self._last_tree, self._last_url, self._previous_action)

    def _render(self, tree: str, url: str, previous_action: str) -> str:
        assert self._task is not None
        objective = resolve(self._task.intent, self._site_urls)
        if self.options.dialect == "agentgym":
            url = agentgym.to_real_url(url, self._site_urls)
        return f"OBSERVATION:\n{tree}\nURL: {url}\nOBJECTIVE: {objective}\nPREVIOUS ACTION: {previous_action}"

    def _info(self, success: bool) -> dict[str, Any]:
        assert self._task is not None
        return {"success": success, "task_id": self._task.task_id, "family": self._task.family,
                "sites": list(self._task.sites)}

    async def _end_episode(self) -> None:
        tabs, token = self._tabs, self._site_token
        self._tabs, self._site_token, self._done = None, None, True
        try:
            if tabs is not None:
                await self._runtime.call(tabs.close())
        finally:
            if token is not None:
                from envhub.sites.store import site_store

                site_store().close_session(token)


def _hub_token_cookie(origin: str) -> list[dict[str, Any]]:
    """The run's shared token as envhub's auth cookie: with a token set, envhub answers only requests
    that carry it, the browser's requests for the mounted sites included (envhub/auth.py)."""
    from common.auth import token_from_env
    from envhub.auth import COOKIE

    token = token_from_env()
    return [{"name": COOKIE, "value": token, "url": origin, "httpOnly": True}] if token else []


def _login_cookies(auth_dir: str, storage_state: str) -> list[dict[str, Any]]:
    """Cookies of a WebArena login state (``.auth/<site>_state.json``, a Playwright storage state)."""
    if not auth_dir or not storage_state:
        return []
    path = Path(auth_dir).expanduser() / Path(storage_state).name
    if not path.is_file():
        raise OptionsError(f"webnav-v0: login state {path} not found (option auth_dir)")
    keys = ("name", "value", "domain", "path", "expires", "httpOnly", "secure", "sameSite")
    return [{key: cookie[key] for key in keys if key in cookie} for cookie in json.loads(path.read_text())["cookies"]]
