"""Where the learner's groups come from: one interface for live actors and for a recording.

``HeadServer`` (``learner/head.py``) leases tasks to actors and ingests their trajectories;
``ReplaySource`` (``learner/replay.py``) reads a recorded trajectory stream. The training loop
(``learner/main.py``) only ever calls what ``DataSource`` declares, so replay needs no branch of
its own in the loop: what it lacks (leases, actors, staleness) its methods answer as no-ops.
"""

from __future__ import annotations

from typing import Protocol

from learner.group import Group


class DataSource(Protocol):
    """The learner loop's view of its data: completed groups in, accounting and policy news out."""

    max_policy_lag: int | None
    """Versions a sampled token may lag the learner and still train; None: trained as recorded."""

    @property
    def exhausted_is_final(self) -> bool:
        """True when ``get`` returning None means no group will ever come (a recording's end)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def get(self, timeout_s: float) -> Group | None:
        """The next completed group, None when none came within ``timeout_s``."""

    def check_alive(self) -> None:
        """Raise when the source cannot deliver any more groups (its thread died)."""

    def release(self, group: Group) -> None:
        """The loop dropped ``group`` untrained."""

    def consume(self, n_groups: int) -> None:
        """The loop trained on ``n_groups`` groups."""

    def set_policy(self, version: int, turn_cap: int) -> None:
        """Leases from now on are stamped with ``version`` and capped at ``turn_cap`` turns."""

    def expect_version(self, version: int) -> None:
        """Weights of ``version`` are going out: episodes may carry it from now on."""

    def join_requests(self) -> dict[int, int]:
        """The actors that asked to join the weight group (they lack the current weights), each
        with the newest generation it had heard announced."""

    def ledger(self) -> dict[str, int]: ...

    def scalars(self) -> dict[str, float]:
        """The source's own ``async/`` scalars for this step."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...
