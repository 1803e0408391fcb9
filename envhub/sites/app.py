"""The sites' ASGI app: the shop, its admin view and the forum under one FastAPI app.

Paths: ``/shop/...``, ``/admin/...``, ``/forum/...`` (under ``/sites`` when mounted in envhub).
A request without an open session's cookie gets a 403 page, never another session's state.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse

from envhub.sites import admin, forum, shop
from envhub.sites.html import link, page
from envhub.sites.store import UnknownSiteSession


def create_sites_app() -> FastAPI:
    app = FastAPI(title="webnav sites", docs_url=None, redoc_url=None, openapi_url=None)
    for router in (shop.router, admin.router, forum.router):
        app.include_router(router)

    @app.exception_handler(UnknownSiteSession)
    async def no_session(request: Request, error: UnknownSiteSession) -> HTMLResponse:
        body = ("<h1>No webnav session</h1><p>These sites serve webnav-v0 episodes; each episode's browser "
                "carries its own session cookie.</p>")
        return page("No session", "", body, status_code=403)

    @app.get("/")
    async def index(request: Request) -> HTMLResponse:
        links = "".join(f"<li>{link(request, path, name)}</li>" for path, name in (
            ("/shop", "One Stop Market (shop)"), ("/admin", "Shop admin"), ("/forum", "Postmill (forum)")))
        return page("webnav sites", "", f"<h1>webnav sites</h1><ul>{links}</ul>")

    return app
