"""The forum ("Postmill", like WebArena's reddit clone): forums, posts, comments, votes, submissions.

The session is logged in as `SESSION_USER`; its posts, comments and votes land in the session's
own database.
"""

from __future__ import annotations

import sqlite3
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from envhub.sites.data import SESSION_USER
from envhub.sites.html import as_int, button_form, esc, form_fields, link, page, redirect, session_db, url

router = APIRouter(prefix="/forum")
MAX_TEXT_CHARS = 4000


def nav(request: Request) -> str:
    return (link(request, "/forum", "Postmill") + link(request, "/forum", "Forums")
            + link(request, "/forum/submit", "Submit") + link(request, f"/forum/u/{SESSION_USER}", SESSION_USER))


def post_summary(request: Request, post: sqlite3.Row) -> str:
    title = link(request, f"/forum/f/{post['forum']}/{post['id']}", post["title"])
    comments = link(request, f"/forum/f/{post['forum']}/{post['id']}", f"{post['n']} comments")
    return (f"<article><h2>{title}</h2><p>Submitted by {link(request, '/forum/u/' + post['author'], post['author'])} "
            f"on {esc(post['created'])} in f/{esc(post['forum'])} · {post['score']} points · {comments}</p></article>")


POSTS_WITH_COUNTS = "SELECT p.*, (SELECT COUNT(*) FROM comments c WHERE c.post_id = p.id) AS n FROM posts p"


@router.get("")
async def home(request: Request) -> HTMLResponse:
    with session_db(request) as db:
        forums = db.execute("SELECT f.*, (SELECT COUNT(*) FROM posts p WHERE p.forum = f.name) AS n FROM forums f "
                            "ORDER BY f.name").fetchall()
    items = "".join(f"<li>{link(request, '/forum/f/' + f['name'], 'f/' + f['name'])}: {esc(f['description'])} "
                    f"({f['n']} posts)</li>" for f in forums)
    return page("Forums - Postmill", nav(request), f"<h1>Forums</h1><ul>{items}</ul>")


@router.get("/f/{forum}")
async def forum(request: Request, forum: str) -> HTMLResponse:
    with session_db(request) as db:
        f = db.execute("SELECT * FROM forums WHERE name = ?", (forum,)).fetchone()
        posts = db.execute(f"{POSTS_WITH_COUNTS} WHERE p.forum = ? ORDER BY p.id DESC", (forum,)).fetchall()
    if f is None:
        return page("Not found - Postmill", nav(request), "<h1>Forum not found</h1>")
    body = (f"<h1>f/{esc(forum)}</h1><p>{esc(f['description'])}</p>"
            + link(request, f"/forum/submit?forum={forum}", "Submit a new post")
            + "".join(post_summary(request, post) for post in posts))
    return page(f"f/{forum} - Postmill", nav(request), body)


@router.get("/f/{forum}/{post_id}")
async def post(request: Request, forum: str, post_id: int) -> HTMLResponse:
    with session_db(request) as db:
        p = db.execute("SELECT * FROM posts WHERE id = ? AND forum = ?", (post_id, forum)).fetchone()
        comments = db.execute("SELECT * FROM comments WHERE post_id = ? ORDER BY id", (post_id,)).fetchall()
        vote = db.execute("SELECT direction FROM votes WHERE post_id = ?", (post_id,)).fetchone()
    if p is None:
        return page("Not found - Postmill", nav(request), "<h1>Post not found</h1>")
    voted = {1: "<p>You upvoted this post.</p>", -1: "<p>You downvoted this post.</p>"}.get(vote[0] if vote else 0, "")
    votes = "".join(button_form(request, "/forum/vote", label, {"post_id": post_id, "direction": direction})
                    for label, direction in (("Upvote", 1), ("Downvote", -1)))
    listing = "".join(f"<li>{link(request, '/forum/u/' + c['author'], c['author'])}: {esc(c['body'])}</li>"
                      for c in comments)
    reply = (f'<form method="post" action="{esc(url(request, f"/forum/f/{forum}/{post_id}/comment"))}">'
             '<label>Comment <textarea name="body" rows="3" cols="50"></textarea></label> '
             '<button>Post Comment</button></form>')
    body = (f"<article><h1>{esc(p['title'])}</h1><p>Submitted by "
            f"{link(request, '/forum/u/' + p['author'], p['author'])} on {esc(p['created'])} in "
            f"{link(request, '/forum/f/' + forum, 'f/' + forum)}</p><p class=\"post-body\">{esc(p['body'])}</p>"
            f"<p>Score: {p['score']} points</p>{voted}{votes}</article>"
            f"<section><h2>{len(comments)} comments</h2><ul>{listing}</ul>{reply}</section>")
    return page(f"{p['title']} - Postmill", nav(request), body)


@router.post("/f/{forum}/{post_id}/comment")
async def comment(request: Request, forum: str, post_id: int) -> Response:
    text = (await form_fields(request)).get("body", "").strip()[:MAX_TEXT_CHARS]
    with session_db(request) as db:
        if text and db.execute("SELECT 1 FROM posts WHERE id = ?", (post_id,)).fetchone():
            db.execute("INSERT INTO comments (post_id, author, body) VALUES (?, ?, ?)", (post_id, SESSION_USER, text))
    return redirect(request, f"/forum/f/{forum}/{post_id}")


@router.post("/vote")
async def vote(request: Request) -> Response:
    fields = await form_fields(request)
    post_id, direction = as_int(fields.get("post_id")), as_int(fields.get("direction"))
    with session_db(request) as db:
        p = db.execute("SELECT forum FROM posts WHERE id = ?", (post_id,)).fetchone()
        if p is None or direction not in (1, -1):
            return redirect(request, "/forum")
        old = db.execute("SELECT direction FROM votes WHERE post_id = ?", (post_id,)).fetchone()
        db.execute("INSERT OR REPLACE INTO votes VALUES (?, ?)", (post_id, direction))
        db.execute("UPDATE posts SET score = score + ? WHERE id = ?", (direction - (old[0] if old else 0), post_id))
    return redirect(request, f"/forum/f/{p['forum']}/{post_id}")


@router.get("/submit")
async def submit_form(request: Request, forum: str = "", error: str = "") -> HTMLResponse:
    with session_db(request) as db:
        names = [row[0] for row in db.execute("SELECT name FROM forums ORDER BY name")]
    options = "".join(f'<option value="{n}"{" selected" if n == forum else ""}>f/{n}</option>' for n in names)
    problem = f'<p role="alert">{esc(error)}</p>' if error else ""
    body = (f'<h1>Create submission</h1>{problem}<form method="post" action="{esc(url(request, "/forum/submit"))}">'
            f'<label>Forum <select name="forum">{options}</select></label><br>'
            '<label>Title <input type="text" name="title" size="60"></label><br>'
            '<label>Body <textarea name="body" rows="5" cols="60"></textarea></label><br>'
            "<button>Create submission</button></form>")
    return page("Create submission - Postmill", nav(request), body)


@router.post("/submit")
async def submit(request: Request) -> Response:
    fields = await form_fields(request)
    forum, title = fields.get("forum", ""), fields.get("title", "").strip()[:300]
    with session_db(request) as db:
        if not title or not db.execute("SELECT 1 FROM forums WHERE name = ?", (forum,)).fetchone():
            return redirect(request, f"/forum/submit?forum={quote(forum)}&error=A+title+and+a+forum+are+required")
        cursor = db.execute("INSERT INTO posts (forum, author, title, body, created, score) "
                            "VALUES (?, ?, ?, ?, date('now'), 1)",
                            (forum, SESSION_USER, title, fields.get("body", "").strip()[:MAX_TEXT_CHARS]))
    return redirect(request, f"/forum/f/{forum}/{cursor.lastrowid}")


@router.get("/u/{user}")
async def user(request: Request, user: str) -> HTMLResponse:
    with session_db(request) as db:
        posts = db.execute(f"{POSTS_WITH_COUNTS} WHERE p.author = ? ORDER BY p.id DESC", (user,)).fetchall()
        comments = db.execute("SELECT COUNT(*) FROM comments WHERE author = ?", (user,)).fetchone()[0]
    body = (f"<h1>{esc(user)}</h1><p>{len(posts)} submissions, {comments} comments</p>"
            + "".join(post_summary(request, post) for post in posts))
    return page(f"{user} - Postmill", nav(request), body)
