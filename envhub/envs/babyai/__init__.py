"""babyai-v0: BabyAI (through minigrid) as a text game with macro-actions, in two dialects.

Modules: levels (the 40 levels, task ids and splits of both dialects), env (the ``Environment``,
which picks a dialect), worked_example (the scripted policy of the worked example), fidelity
(AgentGym fidelity cases).
``agentgym`` dialect: agentgym_game (AgentGym's client parsing, server rules and score),
agentgym_scene (what its server sees, as text), agentgym_actions (its action table),
agentgym_paths (its route finder).
``lenient`` dialect: lenient (one episode), planner (shortest primitive routes), view (what the agent
sees, as text), commands (action grammar, world snapshot per turn), macros (checking and compiling
actions).
"""

from envhub.envs.babyai.env import BabyAIEnv

__all__ = ["BabyAIEnv"]
