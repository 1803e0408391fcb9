"""Built-in environments: one `register(...)` line each.

Loaded by envhub.registry on first use; the entry points are imported only on `make`.
"""

from envhub.registry import register

register(
    "keydoor-v0",
    entry_point="envhub.envs.keydoor:KeyDoorEnv",
    max_turns=12,
    splits={"train": range(0, 10000), "test": range(10000, 11000)},
)

# Any AgentGym env server, by URL and family: envhub.env_options {agentgym-v0: {url: ..., family: webshop,
# num_tasks: N}} (envhub/envs/agentgym.py: the families, the options, one id per server).
register("agentgym-v0", entry_point="envhub.envs.agentgym:AgentGymEnv", max_turns=30, splits=None)

# Deep Search (Search-R1 style) over a local BM25 corpus; FlashRAG JSONL via
# envhub.env_options {search-v0: {corpus_path: ..., questions_path: ...}}, else an offline Wikipedia set.
# max_turns 30: AgentGym-RL's examples/eval/searchqa_eval.sh (max_rounds=30).
register("search-v0", entry_point="envhub.envs.search.env:DeepSearchEnv", max_turns=30, splits=None)

# TextCraft (ADaPT): Minecraft 1.16 recipes from minecraft-data by default, or a data-pack folder via
# envhub.env_options {textcraft-v0: {recipes_dir: ...}}; splits depth1..depth4, train, test, all.
# AgentGym's dialect by default (option dialect: agentgym | lenient); max_turns 30 = AgentGym-RL's
# max_rounds in examples/eval/textcraft_eval.sh.
register("textcraft-v0", entry_point="envhub.envs.textcraft.env:TextCraftEnv", max_turns=30, splits=None)

# BabyAI through minigrid: 40 levels (envhub/envs/babyai/levels.py); option dialect: agentgym (default; task id =
# AgentGym's data_idx) or lenient (task id = level * seeds_per_level + seed); splits train, test and per family
# (goto, goto_test, open, ...). max_turns 20: AgentGym-RL's examples/eval/babyai_eval.sh max_rounds.
register("babyai-v0", entry_point="envhub.envs.babyai:BabyAIEnv", max_turns=20, splits=None)

# ScienceWorld (scienceworld on PyPI, Java 17): tasks x their variations, numbered per dialect (agentgym: AgentGym's
# 23 tasks in ScienceWorld's task-id order; lenient: all 30 sorted; envhub/envs/sciworld/task_index.py);
# ScienceWorld's own train/dev/test splits plus all. max_turns: AgentGym-RL's examples/eval/sciworld_eval.sh.
# Options (dialect, simplification, max_jvms, jvm_heap_mb, hint_max_actions): envhub/envs/sciworld/env.py.
register("sciworld-v0", entry_point="envhub.envs.sciworld.env:SciWorldEnv", max_turns=30, splits=None)

# Web navigation in headless Chromium (Playwright + Debian's /usr/bin/chromium), WebArena's observations,
# actions and evaluators. Offline tasks on envhub's own sites (/sites: shop, admin, forum) by default; real
# WebArena via envhub.env_options {webnav-v0: {task_source: webarena, task_files: [...], site_urls: {...}}}.
# max_turns 15: AgentGym-RL's examples/eval/webarena_eval.sh (max_rounds=15).
register("webnav-v0", entry_point="envhub.envs.webnav.env:WebNavEnv", max_turns=15, splits=None)
