"""Offline websites for webnav-v0: a shop, its admin view and a forum, with per-session state.

`create_sites_app()` (envhub/sites/app.py) is the ASGI app; envhub mounts it at ``/sites``
(`mount_sites`), and `standalone_sites_url()` serves it on a loopback port when the env runs
outside an envhub server (the conformance checker in-process, the bench). State lives in one
SQLite file per session (envhub/sites/store.py), picked by the ``webnav_session`` cookie.
"""
