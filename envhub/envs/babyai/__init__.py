"""babyai-v0: BabyAI (through minigrid) as a text game with macro-actions.

Modules: levels (the 40 levels, task ids, splits), planner (shortest primitive routes),
view (what the agent sees, as text), commands (action grammar, world snapshot per turn),
macros (checking and compiling actions), env (the ``Environment``).
"""

from envhub.envs.babyai.env import BabyAIEnv

__all__ = ["BabyAIEnv"]
