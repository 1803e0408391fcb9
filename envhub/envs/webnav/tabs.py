"""One session's browser tabs: WebArena's actions executed in a leased context, and its observation.

Every method runs on the browser thread (envhub/envs/webnav/browser.py). An action that fails
(no such element, a timeout, a bad URL) returns feedback for the agent; a crashed page or a dead
browser raises `BrowserCrashed`, which ends the episode as an env error.

Page loads: an init script flags a page that is about to leave (a followed link, a submitted
form, ``beforeunload``); after an action that flag decides whether to wait for the next
document, so a click that does not navigate costs no fixed sleep.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from playwright.async_api import BrowserContext, CDPSession, Page
from playwright.async_api import Error as PlaywrightError

from envhub.envs.webnav.actions import WebAction
from envhub.envs.webnav.browser import BrowserCrashed, BrowserPool, PagePoolFull
from envhub.envs.webnav.observation import layout_boxes, render_tree

LEAVING_FLAG_SCRIPT = """(() => {
  const leaving = () => { window.__webnavLeaving = true; };
  window.addEventListener('beforeunload', leaving, true);
  document.addEventListener('submit', (event) => { if (!event.defaultPrevented) leaving(); });
  window.addEventListener('click', (event) => {
    const anchor = event.target instanceof Element ? event.target.closest('a[href]') : null;
    if (!anchor || event.defaultPrevented || (anchor.target && anchor.target !== '_self')) return;
    const to = new URL(anchor.href, location.href);
    if (to.href.split('#')[0] !== location.href.split('#')[0]) leaving();
  });
})();"""
CENTER_FUNCTION = """function () {
  const text = this.nodeType === Node.TEXT_NODE;
  const element = text ? this.parentElement : this;
  if (element && element.scrollIntoViewIfNeeded) element.scrollIntoViewIfNeeded(true);
  let rect;
  if (text) {
    const range = document.createRange(); range.selectNodeContents(this); rect = range.getBoundingClientRect();
  }
  else { rect = this.getBoundingClientRect(); }
  return [rect.x + rect.width / 2, rect.y + rect.height / 2, rect.width, rect.height];
}"""
KEY_NAMES = {"ctrl": "Control", "control": "Control", "cmd": "Meta", "meta": "Meta", "alt": "Alt", "shift": "Shift",
             "enter": "Enter", "return": "Enter", "esc": "Escape", "escape": "Escape", "tab": "Tab", "space": "Space",
             "backspace": "Backspace", "delete": "Delete", "up": "ArrowUp", "down": "ArrowDown", "left": "ArrowLeft",
             "right": "ArrowRight", "pageup": "PageUp", "pagedown": "PageDown", "home": "Home", "end": "End"}
SETTLING_ACTIONS = frozenset({"click", "type", "press", "hover"})


class ActionRefused(Exception):
    """The action cannot run as written; the message is feedback for the agent."""


@dataclass(frozen=True)
class TabSettings:
    """Per-session browser limits (from `WebNavOptions`)."""

    max_tabs: int
    page_wait_s: float
    action_timeout_s: float
    navigation_timeout_s: float
    viewport_only: bool
    settle_s: float


class BrowserTabs:
    """The tabs of one session, in one leased browser context."""

    def __init__(self, pool: BrowserPool, context: BrowserContext, settings: TabSettings) -> None:
        self.pool, self.context, self.settings = pool, context, settings
        self.pages: list[Page] = []
        self.current = 0
        self.crash: str | None = None
        self.origins: set[str] = set()
        self.element_ids: dict[int, int] = {}
        """Ids shown in the last observation -> backend DOM node ids."""
        self.allowed_sites: tuple[str, ...] = ()
        """Base URLs ``goto`` may go to or below (the task's sites); empty: anywhere over http(s)."""
        self._cdp: dict[Page, CDPSession] = {}
        context.on("page", self._on_new_page)

    @classmethod
    async def open(cls, pool: BrowserPool, settings: TabSettings, cookies: list[dict[str, Any]]) -> BrowserTabs:
        tabs = cls(pool, await pool.lease(LEAVING_FLAG_SCRIPT), settings)
        try:
            if cookies:
                await tabs.context.add_cookies(cookies)  # type: ignore[arg-type]
            await pool.new_page(tabs.context, settings.page_wait_s)  # _on_new_page adopts it
        except BaseException:
            await tabs.close()
            raise
        return tabs

    @property
    def page(self) -> Page:
        return self.pages[self.current]

    async def close(self) -> None:
        self.context.remove_listener("page", self._on_new_page)
        self._cdp.clear()
        await self.pool.give_back(self.context, reusable=self.crash is None, origins=self.origins)

    def check_alive(self) -> None:
        """Raise `BrowserCrashed` if a page crashed or the browser is gone."""
        browser = self.context.browser
        if self.crash is None and browser is not None and not browser.is_connected():
            self.crash = "the browser disconnected"
        if self.crash is not None:
            raise BrowserCrashed(f"webnav-v0: {self.crash}")

    async def goto(self, url: str) -> int | None:
        """Load `url` in the current tab; returns the HTTP status (None for about:blank and the like)."""
        response = await self.page.goto(url, wait_until="load", timeout=self.settings.navigation_timeout_s * 1000)
        return None if response is None else response.status

    async def execute(self, action: WebAction) -> str | None:
        """Run one action; returns feedback for the agent when it failed or was refused."""
        try:
            feedback = await getattr(self, f"_do_{action.kind}")(action)
            if action.kind in SETTLING_ACTIONS:
                feedback = await self._settle() or feedback
        except ActionRefused as refusal:
            feedback = str(refusal)
        except PlaywrightError as error:
            message = (error.message or str(error)).strip().splitlines()[0][:300]
            if "crash" in message.lower():  # the crash event may not have arrived yet
                self.crash = f"the page {self.page.url[:200]} crashed ({message})"
            self.check_alive()
            feedback = f"the browser reported: {message}"
        self.check_alive()
        return feedback

    async def observe(self) -> tuple[str, str]:
        """The current tab's accessibility tree under the tab list (WebArena style) and its URL;
        records the ids shown, the only ones actions may use."""
        self.check_alive()
        page = self.page
        try:
            cdp = await self._session(page)
            nodes = (await cdp.send("Accessibility.getFullAXTree"))["nodes"]
            boxes = None
            if self.settings.viewport_only:
                boxes = layout_boxes(await cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": []}))
            *viewport, title = await page.evaluate("[scrollX, scrollY, innerWidth, innerHeight, document.title]")
            titles = [title if tab is page else await tab.title() for tab in self.pages]
        except PlaywrightError as error:  # without a readable page the episode cannot go on
            self.check_alive()
            raise BrowserCrashed(f"webnav-v0: cannot read the page {page.url[:200]}: {error.message}") from None
        tree = render_tree(nodes, boxes, tuple(viewport))  # type: ignore[arg-type]
        self.element_ids = tree.element_ids
        header = " | ".join(f"Tab {index}{' (current)' if index == self.current else ''}: {title}"
                            for index, title in enumerate(titles))
        return f"{header}\n\n{tree.text}", page.url

    # --- actions ----------------------------------------------------------------------------

    async def _do_click(self, action: WebAction) -> None:
        x, y = await self._center(action.element_id)
        await self.page.mouse.click(x, y)

    async def _do_hover(self, action: WebAction) -> None:
        x, y = await self._center(action.element_id)
        await self.page.mouse.move(x, y)

    async def _do_type(self, action: WebAction) -> None:
        x, y = await self._center(action.element_id)
        await self.page.mouse.click(x, y)
        if action.clear_first:  # replace the field's content, not append to it
            await self.page.keyboard.press("Control+a")
            await self.page.keyboard.press("Backspace")
        await self.page.keyboard.type(action.text)
        if action.press_enter:
            await self.page.keyboard.press("Enter")

    async def _do_press(self, action: WebAction) -> None:
        keys = [KEY_NAMES.get(key.strip().lower(), key.strip()) for key in action.text.split("+")]
        if not all(keys):
            raise ActionRefused(f"cannot read the key combination {action.text!r}; e.g. press [Control+a]")
        await self.page.keyboard.press("+".join(keys))

    async def _do_scroll(self, action: WebAction) -> None:
        sign = "-" if action.text == "up" else ""
        await self.page.evaluate(f"window.scrollBy(0, {sign}window.innerHeight)")

    async def _do_goto(self, action: WebAction) -> None:
        if action.text == "about:blank":
            await self.goto(action.text)
            return
        if urlparse(action.text).scheme not in ("http", "https"):
            raise ActionRefused(f"goto takes an http(s) URL, got {action.text[:100]!r}")
        # The offline sites share a server with envhub's other pages (/ui shows past episodes):
        # an agent must not browse its way to the answers.
        if self.allowed_sites and not any(action.text == site or action.text.startswith((f"{site}/", f"{site}?"))
                                          for site in self.allowed_sites):
            raise ActionRefused(f"goto is limited to this task's sites: {', '.join(self.allowed_sites)}")
        await self.goto(action.text)

    async def _do_go_back(self, action: WebAction) -> str | None:
        moved = await self.page.go_back(wait_until="load", timeout=self.settings.navigation_timeout_s * 1000)
        return None if moved is not None else "there is no previous page in this tab"

    async def _do_go_forward(self, action: WebAction) -> str | None:
        moved = await self.page.go_forward(wait_until="load", timeout=self.settings.navigation_timeout_s * 1000)
        return None if moved is not None else "there is no next page in this tab"

    async def _do_new_tab(self, action: WebAction) -> None:
        if len(self.pages) >= self.settings.max_tabs:
            raise ActionRefused(f"a session may hold at most {self.settings.max_tabs} tabs; close one first")
        try:
            page = await self.pool.new_page(self.context, wait_s=0.0)
        except PagePoolFull as error:
            raise ActionRefused(f"cannot open a tab now: {error}") from None
        self.current = self.pages.index(page)

    async def _do_tab_focus(self, action: WebAction) -> None:
        index = int(action.text)
        if not 0 <= index < len(self.pages):
            raise ActionRefused(f"there is no tab {index}; tabs are numbered 0 to {len(self.pages) - 1}")
        self.current = index
        await self.page.bring_to_front()

    async def _do_close_tab(self, action: WebAction) -> None:
        page = self.pages.pop(self.current)
        self._cdp.pop(page, None)
        await page.close()
        if not self.pages:
            await self.pool.new_page(self.context, self.settings.page_wait_s)
        self.current = len(self.pages) - 1
        await self.page.bring_to_front()

    # --- helpers ------------------------------------------------------------------------------

    async def _center(self, element_id: int | None) -> tuple[float, float]:
        backend_id = self.element_ids.get(element_id)  # type: ignore[arg-type]
        if backend_id is None:
            raise ActionRefused(f"there is no element [{element_id}] on the page; use an id from the observation")
        cdp = await self._session(self.page)
        try:
            handle = await cdp.send("DOM.resolveNode", {"backendNodeId": backend_id, "objectGroup": "webnav"})
            result = await cdp.send("Runtime.callFunctionOn", {
                "objectId": handle["object"]["objectId"], "functionDeclaration": CENTER_FUNCTION,
                "returnByValue": True})
        finally:
            await cdp.send("Runtime.releaseObjectGroup", {"objectGroup": "webnav"})
        x, y, width, height = result["result"]["value"]
        if width <= 0 or height <= 0:
            raise ActionRefused(f"element [{element_id}] is not visible")
        return x, y

    async def _settle(self) -> str | None:
        """Wait for the document an action started loading, if it started one."""
        try:
            # A fast navigation may already have committed: then the new document is still loading.
            leaving = await self.page.evaluate("window.__webnavLeaving === true || document.readyState !== 'complete'")
        except PlaywrightError:
            leaving = True  # the old document went away during the call: a navigation committed
        if leaving:
            try:
                await self.page.wait_for_function(
                    "window.__webnavLeaving !== true && document.readyState === 'complete'",
                    timeout=self.settings.navigation_timeout_s * 1000)
            except PlaywrightError:
                self.check_alive()
                return f"the page did not finish loading within {self.settings.navigation_timeout_s:g}s"
        if self.settings.settle_s > 0:
            await asyncio.sleep(self.settings.settle_s)
        return None

    async def _session(self, page: Page) -> CDPSession:
        if page not in self._cdp:
            self._cdp[page] = await self.context.new_cdp_session(page)
        return self._cdp[page]

    def _on_new_page(self, page: Page) -> None:
        """Adopt a page of this context (a new tab or a popup) as the current tab, within the caps."""
        if len(self.pages) >= self.settings.max_tabs or self.pool.open_pages() > self.pool.settings.max_pages:
            asyncio.ensure_future(page.close())
            return
        page.set_default_timeout(self.settings.action_timeout_s * 1000)
        page.on("crash", lambda _: self._mark_crash(page))
        page.on("framenavigated",
                lambda frame: self._record_origin(page, frame.url) if frame == page.main_frame else None)
        self.pages.append(page)
        self.current = len(self.pages) - 1

    def _mark_crash(self, page: Page) -> None:
        self.crash = f"the page {page.url[:200]} crashed"

    def _record_origin(self, page: Page, url: str) -> None:
        parsed = urlparse(url)
        if parsed.scheme in ("http", "https"):
            self.origins.add(f"{parsed.scheme}://{parsed.netloc}")
