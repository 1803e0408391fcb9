"""The trajectory viewer served by envhub at ``/ui`` (plain HTML and JS, no build step).

It lists the runs under ``envhub.runs_dir``, browses each run's recorded trajectories (turns,
tokens with their loss mask, policy versions, and the learner step and advantage from
``trajectories/trained.msgpack``), and plays any registered environment by hand through
envhub's own session API. Files: ``app.py`` (its app, which the envhub server mounts),
``runs.py`` (run folders and their indexes), ``stream_index.py`` (incremental reading of the
recorded streams), ``render.py`` (turns and token text), ``static/`` (the page).
"""

from envhub.ui.app import VIEWER_MOUNT, create_viewer_app

__all__ = ["VIEWER_MOUNT", "create_viewer_app"]
