"""Small HTML builders shared by the offline sites (no template engine: pages are short).

Markup is plain and semantic (nav, h1, table, form, label) because the agent sees the page as
Chromium's accessibility tree: a labelled input becomes `textbox 'Search'`, a table a grid.
"""

from __future__ import annotations

import contextlib
import html
import sqlite3
from typing import Iterator
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse

from envhub.sites.store import SESSION_COOKIE, site_store

NO_STORE = {"Cache-Control": "no-store"}


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def url(request: Request, path: str) -> str:
    """An absolute path on this site, under the mount point (``/sites`` inside envhub)."""
    return request.scope.get("root_path", "") + path


def link(request: Request, path: str, text: object) -> str:
    return f'<a href="{esc(url(request, path))}">{esc(text)}</a>'


def table(headers: list[str], rows: list[list[str]], row_attrs: list[str] | None = None) -> str:
    """A table; cells are HTML already (escape text with `esc`)."""
    head = "".join(f"<th>{esc(header)}</th>" for header in headers)
    attrs = row_attrs or [""] * len(rows)
    body = "".join(f"<tr{attr}>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>"
                   for attr, row in zip(attrs, rows))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def button_form(request: Request, path: str, label: str, fields: dict[str, object]) -> str:
    """A one-button POST form carrying hidden fields."""
    hidden = "".join(f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in fields.items())
    return f'<form method="post" action="{esc(url(request, path))}">{hidden}<button>{esc(label)}</button></form>'


def page(title: str, nav: str, body: str, status_code: int = 200) -> HTMLResponse:
    document = (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
                "<style>body{font-family:sans-serif;margin:0 1em;font-size:14px}nav a{margin-right:1em}"
                "table{border-collapse:collapse}td,th{padding:2px 8px;text-align:left}</style></head>"
                f"<body><nav>{nav}</nav><main>{body}</main></body></html>")
    return HTMLResponse(document, status_code=status_code, headers=NO_STORE)


def redirect(request: Request, path: str) -> RedirectResponse:
    """Post/redirect/get: a 303 to a page of this site."""
    return RedirectResponse(url(request, path), status_code=303, headers=NO_STORE)


async def form_fields(request: Request) -> dict[str, str]:
    """An urlencoded form body as name -> last value (no multipart parser needed)."""
    fields = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[-1] for name, values in fields.items()}


@contextlib.contextmanager
def session_db(request: Request) -> Iterator[sqlite3.Connection]:
    """The requesting session's database (from its cookie); committed when the block succeeds."""
    db = site_store().connect(request.cookies.get(SESSION_COOKIE))
    try:
        yield db
        db.commit()
    finally:
        db.close()


def as_int(text: str | None, default: int = 0) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        return default
