"""AgentGym fidelity cases of sciworld-v0 (played by envhub/fidelity.py and tests/test_fidelity_sciworld.py).

Task ids are AgentGym's ``data_idx``: its server's ``SciWorldEnv.__init__`` lists ScienceWorld's
tasks in task-id order less seven, so boil variation 0 is 0, find-plant variation 0 is 3536 and
chemistry-mix variation 0 is 4136. The expected answers follow AgentGym's client and server
(``SOURCE``): the reply's action is the stripped text after its last ``Action:``; the server sends
it to scienceworld's ``ScienceWorldEnv.step`` unchanged, and the client returns the simulator's
observation, ``info["score"]`` as the reward, and ``done``. The observation texts and scores are
what scienceworld 1.2.3's ``ScienceWorldEnv.step`` (the call AgentGym's server makes) answers.
"""

from __future__ import annotations

from envhub.fidelity import ExpectedStep, FidelityCase

SOURCE = ("AgentGym agentenv-sciworld/agentenv_sciworld/environment.py SciWorldEnv.reset/step; "
          "agentenv/agentenv/envs/sciworld.py SciworldEnvClient.reset/step; "
          "agentenv/agentenv/controller/utils.py BaseAdapter.parse_react")
BOIL_0, FIND_PLANT_0, CHEMISTRY_MIX_0 = "0", "3536", "4136"
NO_KNOWN_ACTION = "No known action matches that input."
HALLWAY = "This room is called the hallway. In it, you see: \n\tthe agent\n\ta substance called air\n\ta picture\n"


def reply(action: str, thought: str = "I act.") -> str:
    return f"Thought:\n{thought}\n\nAction:\n{action}"


def _steps(*script: tuple[str, str, float, bool]) -> tuple[ExpectedStep, ...]:
    return tuple(ExpectedStep(reply(action), observation=answer, score=score, done=done)
                 for action, answer, score, done in script)


def fidelity_cases() -> list[FidelityCase]:
    return [_find_plant_won(), _chemistry_mix_won(), _wrong_focus(), _unparsed_replies(), _move_limit()]


def _find_plant_won() -> FidelityCase:
    return FidelityCase(
        name="find-plant: focus on a plant and bring it to the red box", task_id=FIND_PLANT_0, source=SOURCE,
        first_observation_contains=(
            "Your task is to find a(n) plant. First, focus on the thing. Then, move it to the red box in the "
            f"kitchen.\n{HALLWAY}",),
        steps=_steps(
            ("open door to greenhouse", "The door is now open.", 8, False),
            ("go to greenhouse", "You move to the greenhouse.", 17, False),
            ("focus on cherry tree", "You focus on the cherry tree.", 67, False),
            ("pick up flower pot 8", "You move the flower pot 8 to the inventory.", 75, False),
            ("open door to hallway", "The door is already open.", 75, False),
            ("go to hallway", "You move to the hallway.", 75, False),
            ("open door to kitchen", "The door is now open.", 75, False),
            ("go to kitchen", "You move to the kitchen.", 83, False),
            ("move flower pot 8 to red box", "You move the flower pot 8 to the red box.", 100, True)),
        success=True)


def _chemistry_mix_won() -> FidelityCase:
    return FidelityCase(
        name="chemistry-mix: examine, pour OBJ into OBJ, mix, focus", task_id=CHEMISTRY_MIX_0, source=SOURCE,
        first_observation_contains=("Your task is to use chemistry to create the substance 'salt water'.", HALLWAY),
        steps=_steps(
            ("open door to kitchen", "The door is now open.", 0, False),
            ("go to kitchen", "You move to the kitchen.", 17, False),
            ("open cupboard", "The cupboard is now open.", 17, False),
            ("pick up ceramic cup", "You move the ceramic cup to the inventory.", 17, False),
            ("examine ceramic cup", "a ceramic cup (containing nothing)", 17, False),
            ("pick up recipe", "You move the recipe to the inventory.", 17, False),
            ("read recipe", "The recipe reads:\nTo make salt water, you need to mix sodium chloride, water.", 25,
             False),
            ("open glass jar", "The glass jar is now open.", 25, False),
            ("pour glass jar into ceramic cup", "You pour the contents of the glass jar into the ceramic cup.", 25,
             False),
            ("examine ceramic cup", "a ceramic cup (containing a substance called sodium chloride)", 25, False),
            ("move ceramic cup to sink", "You move the ceramic cup to the sink.", 25, False),
            ("activate sink", "The sink is now activated.", 42, False),
            ("deactivate sink", "The sink is now deactivated.", 42, False),
            ("pick up ceramic cup", "You move the ceramic cup to the inventory.", 42, False),
            ("mix ceramic cup", "Sodium chloride and water mix to produce salt water.", 50, False),
            ("focus on salt water", "You focus on the salt water.", 100, True)),
        success=True)


def _wrong_focus() -> FidelityCase:
    # scienceworld's step ends the episode once the score is negative; the client reports it as is.
    return FidelityCase(
        name="boil: focusing on the wrong thing fails the task with score -100", task_id=BOIL_0, source=SOURCE,
        first_observation_contains=("Your task is to boil water.", HALLWAY),
        steps=_steps(("focus on agent", "You focus on the agent.", -100, True)), success=False)


def _unparsed_replies() -> FidelityCase:
    """parse_react never refuses a reply: what it extracts, empty or not, goes to the simulator."""
    def refused(text: str) -> ExpectedStep:
        return ExpectedStep(text, observation=NO_KNOWN_ACTION, score=0, done=False)

    return FidelityCase(
        name="boil: replies without a clean action reach the simulator and are not known", task_id=BOIL_0,
        source=SOURCE,
        steps=(
            refused("I will look around."),  # no "Action:": the action is empty
            refused("Thought:\nlowercase marker\n\naction: look around"),  # "Action:" is case-sensitive
            refused(reply("look around") + "\nThought:\nthen more"),  # everything after Action: is the action
            refused(reply("look around") + "</s>"),  # the client cuts five characters for "</s>"
            refused(reply("valid actions")),  # no hint action in AgentGym's server
            ExpectedStep(reply("look around"), observation_contains=(HALLWAY,), score=0, done=False),
            ExpectedStep(reply("inventory"), observation="In your inventory, you see:\n\tan orange", score=0,
                         done=False)))


def _move_limit() -> FidelityCase:
    # ScienceWorldEnv(envStepLimit=100): done once the game passes 100 moves; "wait" takes eleven.
    waits = [ExpectedStep(reply("wait"), observation="You decide to wait for 10 iterations.", score=0, done=False)
             for _ in range(9)]
    last = ExpectedStep(reply("wait"), observation="You decide to wait for 10 iterations.", score=0, done=True)
    return FidelityCase(name="boil: ten waits pass scienceworld's 100-move limit", task_id=BOIL_0, source=SOURCE,
                        steps=(*waits, last), success=False)
