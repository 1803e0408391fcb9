"""The viewer: an app of its own, mounted by the envhub server at ``/ui`` (``envhub/server.py``).

    GET /ui                                        the page (static/index.html; static/app.js, style.css)
    GET /ui/api/runs                               [{name, model, envs, max_steps, trajectory_bytes, ...}]
    GET /ui/api/runs/{run}/trajectories            ?env=&step=&success=&purpose=&offset=&limit=
        -> {total, offset, limit, items: [row], envs, steps, count, bad_records}
        ``step``: a learner step (the episode was trained at it) or ``none`` (never trained on)
    GET /ui/api/runs/{run}/trajectories/{number}   one episode: row, trained, turns, tail, tokenizer

Its schema is ``/ui/openapi.json`` (envhub's own ``/openapi.json`` documents the env API only).
Playing an environment by hand needs no route here: the page calls envhub's own ``/envs`` and
``/sessions`` API. The handlers are plain functions, so FastAPI runs them on its thread pool and
reading a big stream or loading a tokenizer never blocks the env sessions on the event loop.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse

from common.protocol import ProtocolError
from envhub.errors import ERRORS, route_responses
from envhub.ui.render import describe_turns
from envhub.ui.runs import RunCatalog, UnknownRunError
from envhub.ui.stream_index import RunIndex, TrainedRow, TrajectoryRow

VIEWER_MOUNT = "/ui"
STATIC_DIR = Path(__file__).parent / "static"
STATIC_FILES = {"app.js": "text/javascript", "style.css": "text/css"}
MAX_PAGE_ROWS = 1000
_ROW_FIELDS = [f.name for f in dataclasses.fields(TrajectoryRow) if f.name != "offset_bytes"]


TrainedRows = dict[tuple[str, int], TrainedRow]


def row_json(row: TrajectoryRow, trained: TrainedRow | None) -> dict[str, Any]:
    """A list row with the learner step and advantage of the update that used it (None if none)."""
    return {**{name: getattr(row, name) for name in _ROW_FIELDS},
            "learner_step": trained.learner_step if trained else None,
            "advantage": trained.advantage if trained else None}


def matches(row: TrajectoryRow, trained_rows: TrainedRows, env: str | None, step: int | None | str,
            success: bool | None, purpose: str | None) -> bool:
    """Whether ``row`` passes the filters (``step == "any"`` and ``None`` filters pass all)."""
    if env is not None and row.env_id != env:
        return False
    if success is not None and row.success != success:
        return False
    if purpose is not None and row.purpose != purpose:
        return False
    if step != "any":
        trained = trained_rows.get(row.key)
        return (trained.learner_step if trained else None) == step
    return True


def parse_step(step: str | None) -> int | None | str:
    """``None``/"" -> "any"; "none" -> None (never trained on); a number -> that learner step."""
    if step is None or step == "":
        return "any"
    if step == "none":
        return None
    if step.isdigit():
        return int(step)
    raise HTTPException(status_code=ERRORS["bad_query"].status_code,
                        detail=f"step must be a learner step number or 'none', got {step!r}")


def create_viewer_app(runs_dir: str | Path, errors: Counter[str]) -> FastAPI:
    """The viewer's page and JSON API over the run folders in ``runs_dir``; a malformed query is
    counted in ``errors`` (the hub's own counts, so ``/health`` shows it)."""
    catalog = RunCatalog(Path(runs_dir))
    app = FastAPI(title="envhub trajectory viewer", docs_url=None, redoc_url=None)

    @app.exception_handler(RequestValidationError)
    async def count_malformed(request: Request, error: RequestValidationError) -> Any:
        errors["malformed_request"] += 1
        return await request_validation_exception_handler(request, error)

    def index_of(run: str) -> RunIndex:
        try:
            return catalog.index(run)
        except UnknownRunError as error:
            raise HTTPException(status_code=ERRORS["unknown_run"].status_code, detail=str(error)) from None

    def responses(path: str) -> dict[int | str, dict[str, Any]]:
        return route_responses("GET", VIEWER_MOUNT + path)  # errors.py names routes as clients call them

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get("/static/{name}", include_in_schema=False)
    def static_file(name: str) -> FileResponse:
        if name not in STATIC_FILES:  # a fixed list: no path from the URL ever reaches the disk
            raise HTTPException(status_code=404, detail=f"no static file {name!r}")
        return FileResponse(STATIC_DIR / name, media_type=STATIC_FILES[name])

    @app.get("/api/runs", responses=responses("/api/runs"))
    def list_runs() -> dict[str, Any]:
        return {"runs_dir": str(catalog.runs_dir), "runs": catalog.list_runs()}

    @app.get("/api/runs/{run}/trajectories", responses=responses("/api/runs/{run}/trajectories"))
    def list_trajectories(run: str, env: str | None = None, step: str | None = None, success: bool | None = None,
                          purpose: str | None = None, offset: int = Query(0, ge=0),
                          limit: int = Query(100, ge=1, le=MAX_PAGE_ROWS)) -> dict[str, Any]:
        index, wanted_step = index_of(run), parse_step(step)
        rows, trained_rows = index.snapshot()
        selected = [row for row in rows if matches(row, trained_rows, env, wanted_step, success, purpose)]
        return {
            "run": run, "count": len(rows), "total": len(selected), "offset": offset, "limit": limit,
            "items": [row_json(row, trained_rows.get(row.key)) for row in selected[offset:offset + limit]],
            "envs": sorted({row.env_id for row in rows}),
            "steps": sorted({trained.learner_step for trained in trained_rows.values()}),
            "bad_records": index.bad_records,
        }

    @app.get("/api/runs/{run}/trajectories/{number}", responses=responses("/api/runs/{run}/trajectories/{number}"))
    def trajectory(run: str, number: int) -> dict[str, Any]:
        index = index_of(run)
        if not 0 <= number < len(index.rows):
            raise HTTPException(status_code=ERRORS["unknown_run"].status_code,
                                detail=f"run {run} has {len(index.rows)} trajectories; no number {number}")
        row = index.rows[number]
        try:
            episode, trained = index.load(row)
        except (OSError, ProtocolError) as error:
            raise HTTPException(status_code=ERRORS["unreadable_trajectory"].status_code,
                                detail=f"cannot read trajectory {number}: {error}") from None
        slot = catalog.tokenizer(run)
        turns, tail = describe_turns(episode, trained, slot.decoder)
        return {
            "row": row_json(row, index.trained_row(row)), "turns": turns, "tail": tail,
            "trained": None if trained is None else {"learner_step": trained.learner_step,
                                                     "advantage": trained.advantage},
            "tokenizer": {"source": slot.source, "error": slot.error},
            "error": episode.error, "truncated": episode.truncated, "terminated": episode.terminated,
            "timings": episode.timings, "env_info": episode.env_info,
        }

    return app
