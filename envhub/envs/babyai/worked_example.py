"""The worked examples shown before the first observation: won GoTo training tasks, played by a
scripted policy through the env itself in the dialect's own grammar (envhub/examples.py).

The policy reads the GoTo mission, takes the "go to" action for its target once the list of
available actions offers it, and turns left until then; tasks where the target starts out of view
give an example of at least two turns.
"""

from __future__ import annotations

import re

MISSION = re.compile(r"Your goal: go to (?:the|a) ((?:\w+ )?\w+)\n")
LENIENT_ACTIONS = re.compile(r"^Available actions: (.*)\.$", re.MULTILINE)
AGENTGYM_ACTIONS = re.compile(r"^Available actions: \[(.*)\]$", re.MULTILINE)


class GoToPolicy:
    """Observation -> reply for "go to the <colour> <type>" missions, in either dialect."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.goal = ""

    def __call__(self, observation: str) -> str:
        self.goal = mission_goal(observation) or self.goal
        for action in self._available(observation) if self.goal else ():
            if re.fullmatch(rf"go to {self.goal} \d+", action):
                return reply(f"I see the {self.goal}. I will go to it.", action)
        return reply(f"The {self.goal} is not in view. I will turn to look for it.", "turn left")

    def _available(self, observation: str) -> list[str]:
        if self.dialect == "lenient":
            found = LENIENT_ACTIONS.search(observation)
            return found.group(1).split(", ") if found else []
        found = AGENTGYM_ACTIONS.search(observation)
        return re.findall(r'"([^"]*)"', found.group(1)) if found else []


def mission_goal(observation: str) -> str:
    """The object a GoTo mission names ("red ball"); empty for any other observation."""
    mission = MISSION.match(observation)
    return mission.group(1) if mission else ""


def reply(thought: str, action: str) -> str:
    """A reply in AgentGym's BabyAI format (its instruction's "Thought:\\n...\\n\\nAction:\\n...")."""
    return f"Thought:\n{thought}\n\nAction:\n{action}"
