"""The process's browser: one Chromium per pool, driven from one background thread.

Playwright objects belong to the event loop that made them, while envhub may run envs on
several loops (one per server thread, or `asyncio.run` in tests). So every Playwright call runs
on `browser_thread()`, a daemon thread with its own loop, and envs await it through
`BrowserThread.call`; cancelling the awaiting call (envhub's step deadline) cancels the work.

`BrowserPool` (one per launch settings) leases browser contexts to sessions: a closed session's
context is cleared (pages closed, cookies and the visited origins' storage deleted) and handed to
the next session, so a new session costs a page, not a context. The pool caps the pages open
over all sessions. A crashed context is never reused; a browser that died is relaunched.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Coroutine, TypeVar

from playwright.async_api import Browser, BrowserContext, Page, Playwright, async_playwright
from playwright.async_api import Error as PlaywrightError

T = TypeVar("T")
LAUNCH_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage")


class BrowserCrashed(RuntimeError):
    """A page's renderer or the browser died: the episode cannot go on (envhub answers 500, status env_error)."""


class PagePoolFull(RuntimeError):
    """Every page the pool allows is open."""


class BrowserThread:
    """A daemon thread running the event loop that owns every Playwright object of this process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="webnav-browser", daemon=True)
        self._thread.start()
        self.pools: dict[PoolSettings, BrowserPool] = {}
        """Touched only on this thread's loop."""

    async def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the browser loop and await its result from any other loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def call_blocking(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run `coroutine` on the browser loop from synchronous code."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def pool(self, settings: PoolSettings) -> BrowserPool:
        """The pool for `settings` (call on the browser loop)."""
        if settings not in self.pools:
            self.pools[settings] = BrowserPool(settings)
        return self.pools[settings]

    async def close_pool(self, settings: PoolSettings) -> None:
        """Close the pool for `settings` and its browser (call on the browser loop)."""
        pool = self.pools.pop(settings, None)
        if pool is not None:
            await pool.close()

    async def close_pools(self) -> None:
        for pool in list(self.pools.values()):
            await pool.close()
        self.pools.clear()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Close every browser (at interpreter exit; tests may call it to start clean)."""
        if self._thread.is_alive():
            try:
                self.call_blocking(self.close_pools(), timeout_s)
            except Exception:  # exiting anyway; Playwright's driver dies with this process
                pass


@functools.cache
def browser_thread() -> BrowserThread:
    thread = BrowserThread()
    atexit.register(thread.shutdown)
    return thread


@dataclass(frozen=True)
class PoolSettings:
    """What a pool's browser and contexts are launched with (one pool per distinct value)."""

    executable_path: str
    headless: bool
    max_pages: int
    max_idle_contexts: int
    viewport_width: int
    viewport_height: int


class BrowserPool:
    """One Chromium and the contexts leased to sessions; every method runs on the browser loop."""

    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._idle: list[BrowserContext] = []
        self._leased: set[BrowserContext] = set()
        self.counters: Counter[str] = Counter()

    async def lease(self, init_script: str) -> BrowserContext:
        """A context for one session: a cleared idle one if any, else a new one."""
        browser = await self._running_browser()
        if self._idle:
            context = self._idle.pop()
            self.counters["contexts_reused"] += 1
        else:
            context = await browser.new_context(
                viewport={"width": self.settings.viewport_width, "height": self.settings.viewport_height})
            await context.add_init_script(init_script)
            self.counters["contexts_created"] += 1
        self._leased.add(context)
        return context

    async def new_page(self, context: BrowserContext, wait_s: float) -> Page:
        """A new page in `context`, waiting up to `wait_s` for room under the cap; raises `PagePoolFull`."""
        deadline_s = time.monotonic() + wait_s
        while self.open_pages() >= self.settings.max_pages:
            if time.monotonic() > deadline_s:
                raise PagePoolFull(f"all {self.settings.max_pages} pages of the browser pool are open "
                                   "(webnav-v0 option max_pages)")
            await asyncio.sleep(0.05)
        return await context.new_page()

    def open_pages(self) -> int:
        return sum(len(context.pages) for context in self._leased)

    async def give_back(self, context: BrowserContext, reusable: bool, origins: set[str]) -> None:
        """End a lease: keep the context, cleared, for the next session, or close it."""
        self._leased.discard(context)
        keep = reusable and self._browser is not None and self._browser.is_connected() and \
            len(self._idle) < self.settings.max_idle_contexts
        try:
            if keep:
                await _clear(context, origins)
                self._idle.append(context)
                return
            await context.close()
        except PlaywrightError:
            self.counters["contexts_lost"] += 1  # a dead context: nothing left to free
            return
        self.counters["contexts_closed"] += 1

    def stats(self) -> dict[str, int]:
        return {"open_pages": self.open_pages(), "leased_contexts": len(self._leased),
                "idle_contexts": len(self._idle), **self.counters}

    async def close(self) -> None:
        if self._browser is not None:
            await self._browser.close()
        if self._playwright is not None:
            await self._playwright.stop()
        self._browser = self._playwright = None
        self._idle.clear()
        self._leased.clear()

    async def _running_browser(self) -> Browser:
        if self._browser is not None and self._browser.is_connected():
            return self._browser
        if self._playwright is None:
            self._playwright = await async_playwright().start()
        self._idle.clear()  # contexts die with their browser
        self._leased.clear()
        self._browser = await self._playwright.chromium.launch(
            executable_path=self.settings.executable_path, headless=self.settings.headless, args=list(LAUNCH_ARGS))
        self.counters["browser_launches"] += 1
        return self._browser


async def _clear(context: BrowserContext, origins: set[str]) -> None:
    """Forget a session: its sites' storage (local storage, IndexedDB, cache), cookies, then its pages."""
    pages = list(context.pages)
    if pages and origins:
        cdp = await context.new_cdp_session(pages[0])
        for origin in sorted(origins):
            await cdp.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"})
        await cdp.detach()
    await context.clear_cookies()
    for page in pages:
        await page.close()
