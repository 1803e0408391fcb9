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

# Any AgentGym env server, by URL: set envhub.env_options {agentgym-v0: {url: ..., num_tasks: N}}
# (see envhub/envs/agentgym.py for the options and how to register one id per server).
register("agentgym-v0", entry_point="envhub.envs.agentgym:AgentGymEnv", max_turns=30, splits=None)

# Deep Search (Search-R1 style) over a local BM25 corpus; FlashRAG JSONL via
# envhub.env_options {search-v0: {corpus_path: ..., questions_path: ...}}, else an offline Wikipedia set.
register("search-v0", entry_point="envhub.envs.search.env:DeepSearchEnv", max_turns=10, splits=None)

# TextCraft (ADaPT): Minecraft 1.16 recipes from minecraft-data by default, or a data-pack folder via
# envhub.env_options {textcraft-v0: {recipes_dir: ...}}; splits depth1..depth4, train, test, all.
register("textcraft-v0", entry_point="envhub.envs.textcraft.env:TextCraftEnv", max_turns=30, splits=None)

# BabyAI through minigrid: 40 levels (envhub/envs/babyai/levels.py), task id = level * seeds_per_level + seed;
# splits train, test and per family (goto, goto_test, open, ...); options seeds_per_level, test_seeds_per_level.
register("babyai-v0", entry_point="envhub.envs.babyai:BabyAIEnv", max_turns=20, splits=None)

# ScienceWorld (scienceworld on PyPI, Java 17): 30 tasks x their variations, numbered in sorted task order
# (envhub/envs/sciworld/task_index.py, pure data); ScienceWorld's own train/dev/test splits plus all.
# Options (simplification, max_jvms, jvm_heap_mb, hint_max_actions): envhub/envs/sciworld/env.py.
from envhub.envs.sciworld.task_index import task_splits as sciworld_task_splits  # noqa: E402 (pure data, no JVM)

register("sciworld-v0", entry_point="envhub.envs.sciworld.env:SciWorldEnv", max_turns=30,
         splits=sciworld_task_splits())

# Web navigation in headless Chromium (Playwright + Debian's /usr/bin/chromium), WebArena's observations,
# actions and evaluators. Offline tasks on envhub's own sites (/sites: shop, admin, forum) by default; real
# WebArena via envhub.env_options {webnav-v0: {task_source: webarena, task_files: [...], site_urls: {...}}}.
register("webnav-v0", entry_point="envhub.envs.webnav.env:WebNavEnv", max_turns=15, splits=None)
