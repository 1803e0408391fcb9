'''SciWorld's worked example: a won training episode in AgentGym's reply format.

``find-animal`` variation 0 (ScienceWorld's train split; AgentGym task 3836), its observations the
simulator's own words under the agentgym dialect (tests/test_fidelity_sciworld.py replays it and
checks every observation; its rooms list no two objects of one name, whose order ScienceWorld
varies from load to load). A small model copies the format of an exchange far more readily than
it follows an instruction (the format bench's finding on TextCraft), and this one also shows the
grammar AgentGym's instruction lists: ``open OBJ``, ``go to LOC``, ``look around``, ``focus on OBJ``,
``pick up OBJ``, ``move OBJ to OBJ``. About 600 tokens.
'''

from __future__ import annotations

EXAMPLE_TASK = ("find-animal", 0)
"""(ScienceWorld task name, variation) the example plays."""

FIRST_OBSERVATION = (
    "Your task is to find a(n) animal. First, focus on the thing. Then, move it to the red box in the kitchen.\n"
    "This room is called the hallway. In it, you see: \n\tthe agent\n\ta substance called air\n\ta picture\n"
    "You also see:\n\tA door to the art studio (that is closed)\n\tA door to the bedroom (that is closed)\n"
    "\tA door to the greenhouse (that is closed)\n\tA door to the kitchen (that is closed)\n"
    "\tA door to the living room (that is closed)\n\tA door to the workshop (that is closed)"
)

# (thought, action, the simulator's answer)
_EXAMPLE_STEPS = (
    ("Animals are most likely outside, and the greenhouse usually leads there. I open its door first.",
     "open door to greenhouse", "The door is now open."),
    ("The door is open, so I go in.", "go to greenhouse", "You move to the greenhouse."),
    ("Now the door to the outside.", "open door to outside", "The door is now open."),
    ("I go outside to look for animals.", "go to outside", "You move to the outside."),
    ("Let me see what is out here.", "look around",
     "This outside location is called the outside. Here you see: \n\tthe agent\n\ta substance called air\n"
     "\tan axe\n\ta blue jay egg\n\ta butterfly egg\n\ta dove egg\n\ta fire pit (containing nothing)\n"
     "\ta fountain (containing a substance called water)\n\tthe ground\n\ta substance called wood\n"
     "You also see:\n\tA door to the foundry (that is closed)\n\tA door to the greenhouse (that is open)\n"
     "\tA door to the kitchen (that is closed)"),
    ("A blue jay egg is an animal in its egg stage. I focus on it first, as the task says.",
     "focus on blue jay egg", "You focus on the blue jay egg."),
    ("Now I carry it to the kitchen.", "pick up blue jay egg", "You move the blue jay to the inventory."),
    ("The kitchen door is right here.", "open door to kitchen", "The door is now open."),
    ("I go to the kitchen, where the red box is.", "go to kitchen", "You move to the kitchen."),
    ("Finally I put the blue jay egg in the red box.", "move blue jay egg to red box",
     "You move the blue jay to the red box."),
)


def agentgym_reply(thought: str, action: str) -> str:
    """A reply in the format AgentGym's instruction asks for."""
    return f"Thought:\n{thought}\n\nAction:\n{action}"


def _turns() -> tuple[tuple[str, str], ...]:
    observations = (FIRST_OBSERVATION, *(answer for _, _, answer in _EXAMPLE_STEPS[:-1]))
    return tuple((observation, agentgym_reply(thought, action))
                 for observation, (thought, action, _) in zip(observations, _EXAMPLE_STEPS))


WORKED_EXAMPLE: tuple[tuple[str, str], ...] = _turns()
"""(observation, reply) turns; the last reply wins the task."""

EXAMPLE_ANSWERS: tuple[str, ...] = tuple(answer for _, _, answer in _EXAMPLE_STEPS)
"""What the simulator answers to each reply (the last one ends the episode with score 100)."""
