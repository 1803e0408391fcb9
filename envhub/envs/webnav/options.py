"""Options of webnav-v0 (``envhub.env_options: {webnav-v0: {...}}``), checked on construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlparse

TASK_SOURCES = ("offline", "webarena")
DIALECTS = ("agentgym", "lenient")
WEBARENA_SITES = ("shopping", "shopping_admin", "reddit", "gitlab", "map", "wikipedia", "homepage")


@dataclass(frozen=True)
class WebNavOptions:
    """How webnav-v0 finds its tasks, its sites and its browser."""

    dialect: str = "agentgym"
    """``agentgym``: AgentGym's WebArena client and server (the action in the reply's first ```block```,
    its parser, messages and PREVIOUS ACTION wording; envhub/envs/webnav/agentgym_dialect.py);
    ``lenient``: this project's earlier rules (``Action:`` lines or fenced blocks, feedback inline)."""

    task_source: str = "offline"
    """``offline``: the built-in tasks on envhub's own sites; ``webarena``: WebArena task files
    (``task_files``) against a WebArena deployment (``site_urls``)."""

    task_files: list[str] = field(default_factory=list)
    """WebArena task files (webarena only): JSON files holding a task or a list of tasks, or folders
    of such files (WebArena's ``config_files/``)."""

    site_urls: dict[str, str] = field(default_factory=dict)
    """Base URL per WebArena site (webarena only): shopping, shopping_admin, reddit, gitlab, map,
    wikipedia, homepage; they replace the ``__SHOPPING__``-style placeholders of the tasks."""

    auth_dir: str = ""
    """Folder of WebArena's login states (``.auth/*.json``, Playwright storage states): the cookies of
    a task's ``storage_state`` file are loaded before its start page. Empty: no login."""

    test_every: int = 5
    """webarena only: every n-th task (by task_id) goes to the ``test`` split, the rest to ``train``."""

    sites_url: str = "auto"
    """Base URL of the offline sites: ``auto`` uses the envhub server's own ``/sites`` when the env
    runs inside one, else a loopback server of this process; or give a URL."""

    executable_path: str = "/usr/bin/chromium"
    """The Chromium binary Playwright launches (Debian's chromium; never a downloaded browser)."""

    headless: bool = True
    """Run Chromium without a window."""

    viewport_width: int = 1280
    """Browser viewport width in pixels (WebArena's)."""

    viewport_height: int = 720
    """Browser viewport height in pixels (WebArena's)."""

    viewport_only: bool = True
    """Show only elements inside the viewport, as WebArena's ``current_viewport_only`` (scroll to see more)."""

    max_pages: int = 256
    """Most pages open at once in this process's browser, over all sessions (the pool's cap)."""

    max_tabs: int = 4
    """Most tabs one session may hold; ``new_tab`` beyond it is refused with a message."""

    max_idle_contexts: int = 16
    """Closed sessions' browser contexts kept (cleared) for the next sessions to reuse."""

    page_wait_s: float = 5.0
    """How long a reset waits for a free page when the pool is at ``max_pages``."""

    action_timeout_s: float = 5.0
    """Deadline of one browser action (click, key press, evaluation)."""

    navigation_timeout_s: float = 8.0
    """Deadline of one page load (keep it under envhub's ``step_timeout_s``)."""

    settle_s: float = 0.0
    """Extra wait after each action, for sites that render with JavaScript after loading."""

    max_observation_chars: int = 12000
    """Longest observation; a longer accessibility tree is cut at a line with a note."""

    def __post_init__(self) -> None:
        if self.dialect not in DIALECTS:
            raise ValueError(f"webnav-v0: option dialect must be one of {DIALECTS}, got {self.dialect!r}")
        if self.task_source not in TASK_SOURCES:
            raise ValueError(f"webnav-v0: task_source must be one of {TASK_SOURCES}, got {self.task_source!r}")
        if self.task_source == "webarena" and not self.task_files:
            raise ValueError("webnav-v0: task_source webarena needs task_files (WebArena's task JSON files)")
        unknown_sites = sorted(set(self.site_urls) - set(WEBARENA_SITES))
        if unknown_sites:
            raise ValueError(f"webnav-v0: unknown sites {unknown_sites} in site_urls; known: {WEBARENA_SITES}")
        given_sites_url = [("sites_url", self.sites_url)] if self.sites_url != "auto" else []
        for name, url in [*self.site_urls.items(), *given_sites_url]:
            if urlparse(url).scheme not in ("http", "https"):
                raise ValueError(f"webnav-v0: {name} must be an http(s) URL, got {url!r}")
        for name in ("max_pages", "max_tabs", "viewport_width", "viewport_height", "test_every",
                     "max_observation_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"webnav-v0: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("page_wait_s", "action_timeout_s", "navigation_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"webnav-v0: {name} must be > 0, got {getattr(self, name)}")
