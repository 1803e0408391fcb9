"""Built-in environments: one `register(...)` line each.

Loaded by envhub.registry on first use; the entry points are imported only on `make`.
"""

from envhub.registry import register

register(
    "keydoor-v0",
    entry_point="envhub.envs.keydoor:KeyDoorEnv",
    max_turns=8,
    splits={"train": range(0, 10000), "test": range(10000, 11000)},
)
