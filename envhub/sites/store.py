"""Per-session site state: one SQLite file per webnav session, copied from a seeded template.

`site_store()` is the process-wide store. `open_session()` copies the template database (built
once per process from envhub/sites/data.py) to a fresh file and returns a random token; the
browser carries the token in the `webnav_session` cookie, so every request of a session reads
and writes its own file and sessions never see each other's carts, orders or posts.
`close_session(token)` deletes the file. Connections are opened per request: handlers run in a
thread pool, and a SQLite connection must not cross threads.
"""

from __future__ import annotations

import atexit
import functools
import secrets
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

from envhub.sites.data import CATEGORIES, CUSTOMERS, FORUMS, USERS, SeedData, seed_data

SESSION_COOKIE = "webnav_session"

SCHEMA = """
CREATE TABLE categories (slug TEXT PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE products (sku TEXT PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price_cents INT NOT NULL,
                       description TEXT NOT NULL, rating REAL NOT NULL, review_count INT NOT NULL, stock INT NOT NULL);
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL, city TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INT NOT NULL, created TEXT NOT NULL, status TEXT NOT NULL,
                     shipping TEXT NOT NULL, address TEXT NOT NULL, total_cents INT NOT NULL);
CREATE TABLE order_items (order_id INT NOT NULL, sku TEXT NOT NULL, qty INT NOT NULL, price_cents INT NOT NULL);
CREATE TABLE cart (sku TEXT PRIMARY KEY, qty INT NOT NULL);
CREATE TABLE forums (name TEXT PRIMARY KEY, title TEXT NOT NULL, description TEXT NOT NULL);
CREATE TABLE users (name TEXT PRIMARY KEY);
CREATE TABLE posts (id INTEGER PRIMARY KEY, forum TEXT NOT NULL, author TEXT NOT NULL, title TEXT NOT NULL,
                    body TEXT NOT NULL, created TEXT NOT NULL, score INT NOT NULL);
CREATE TABLE comments (id INTEGER PRIMARY KEY, post_id INT NOT NULL, author TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE votes (post_id INT PRIMARY KEY, direction INT NOT NULL);
"""


class UnknownSiteSession(KeyError):
    """No open site session has this token (closed, never opened, or no cookie)."""


class SiteStore:
    """Site session tokens -> their SQLite files, under one temporary folder."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="webnav-sites-"))
        self._template = self.root / "template.sqlite"
        _build_template(self._template, seed_data())
        self._paths: dict[str, Path] = {}
        self._lock = threading.Lock()

    def open_session(self) -> str:
        """A new session with fresh seeded state; returns its token."""
        token = secrets.token_hex(16)
        path = self.root / f"{token}.sqlite"
        shutil.copyfile(self._template, path)
        with self._lock:
            self._paths[token] = path
        return token

    def close_session(self, token: str) -> None:
        """Forget the session and delete its file (idempotent)."""
        with self._lock:
            path = self._paths.pop(token, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def connect(self, token: str | None) -> sqlite3.Connection:
        """A connection to the session's database; raises `UnknownSiteSession`."""
        with self._lock:
            path = self._paths.get(token or "")
        if path is None:
            raise UnknownSiteSession(token)
        connection = sqlite3.connect(path, timeout=5.0)
        connection.row_factory = sqlite3.Row
        return connection

    def __len__(self) -> int:
        return len(self._paths)


_store_lock = threading.Lock()


def site_store() -> SiteStore:
    """The process-wide store (sites mounted in envhub and a standalone sites server share it)."""
    with _store_lock:  # first use may come from the env's thread and a request thread at once
        return _make_store()


@functools.cache
def _make_store() -> SiteStore:
    store = SiteStore()
    atexit.register(shutil.rmtree, store.root, ignore_errors=True)
    return store


def _build_template(path: Path, data: SeedData) -> None:
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA)
        db.executemany("INSERT INTO categories VALUES (?, ?)", [(slug, name) for slug, (name, _) in CATEGORIES.items()])
        db.executemany("INSERT INTO products VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [
            (p.sku, p.name, p.category, p.price_cents, p.description, p.rating, p.review_count, p.stock)
            for p in data.products])
        db.executemany("INSERT INTO customers VALUES (?, ?, ?, ?)", [
            (number, name, name.lower().replace(" ", ".") + "@example.com", city)
            for number, (name, city) in enumerate(CUSTOMERS, start=1)])
        prices = {p.sku: p.price_cents for p in data.products}
        for order in data.orders:
            address = f"{order.customer_id * 17} Main St, {CUSTOMERS[order.customer_id - 1][1]}"
            db.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?)", (
                order.id, order.customer_id, order.created, order.status, "standard", address, order.total_cents))
            db.executemany("INSERT INTO order_items VALUES (?, ?, ?, ?)", [
                (order.id, sku, qty, prices[sku]) for sku, qty in order.items])
        db.executemany("INSERT INTO forums VALUES (?, ?, ?)", [(name, *info) for name, info in FORUMS.items()])
        db.executemany("INSERT INTO users VALUES (?)", [(user,) for user in USERS])
        db.executemany("INSERT INTO posts VALUES (?, ?, ?, ?, ?, ?, ?)", [
            (p.id, p.forum, p.author, p.title, p.body, p.created, p.score) for p in data.posts])
        db.executemany("INSERT INTO comments VALUES (?, ?, ?, ?)", [
            (c.id, c.post_id, c.author, c.body) for c in data.comments])
