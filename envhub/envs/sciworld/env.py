"""sciworld-v0: ScienceWorld's 30 science tasks (boil water, find a living thing, build a circuit...).

An episode:
1. ``reset(task_id, seed)``: borrow a simulator JVM from the process-wide pool (jvm_pool.py; the
   first reset of a session only), load the task's (task, variation) (task_index.py) with the
   configured simplifications. The first observation is the instructions with the reply format
   (AgentGym's SciWorld prompt: Thought/Action), the task description and the room. The seed is
   ignored: a variation fixes the world.
2. ``step(reply)``: the action is the text after ``Action:``. ``valid actions`` (or ``hint``)
   lists some actions valid here (spread over verbs, at most ``hint_max_actions``) without
   advancing the game, though it costs the agent a turn; ``reset task`` is refused (it would
   restart the episode and its score); anything else goes to the simulator.
3. Score: ScienceWorld's runs 0..100, and a negative one (-100) means the task failed.
   normalized = max(score, 0) / 100, and each step's reward is the rise of the best normalized
   score so far: rewards are never negative and sum to the best score reached (the final score
   unless it fell), at most 1. ``terminated`` when the task completes (``success``: score 100) or
   fails (negative score); ``truncated`` never (the actor's turn cap bounds episodes).
4. ``close()``: give the JVM back for the next session, or kill it if a call failed or was
   interrupted (its state is unknown).

A session holds its JVM from reset to close, so ``max_jvms`` caps the concurrent ScienceWorld
episodes of one envhub process; a reset beyond the cap waits for a JVM within envhub's
``step_timeout_s`` (then 504). Give the process max_jvms >= its concurrent sciworld sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from envhub.actions import MalformedAction, extract_action
from envhub.base import ConversationStart, Environment, StepResult
from envhub.envs.sciworld import task_index
from envhub.envs.sciworld.jvm_pool import JvmPool, ScienceWorldJvm, get_pool
from envhub.options import OptionsError, parse_options

Result = TypeVar("Result")
SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction")
ELECTRICAL_TASK_MARKS = ("power-component", "conductivity")  # as scienceworld's own load() checks
HINT_COMMANDS = ("valid actions", "hint")
REFUSED_COMMANDS = ("reset task",)
MAX_SCORE = 100

# AgentGym's SciWorld instruction (agentenv/envs/sciworld.py, conversation_start), word for word, then
# one line on this env's hint command, which AgentGym's server does not have.
INSTRUCTIONS = (
    'You are an agent for science world. Every round I will give you an observation, you have to respond an '
    'action based on the observation to finish the given task. Here are the actions you may take: [{"action": '
    '"open/close OBJ", "description": "open/close a container"}, {"action": "de/activate OBJ", "description": '
    '"activate/deactivate a device"}, {"action": "connect OBJ to OBJ", "description": "connect electrical '
    'components"}, {"action": "disconnect OBJ", "description": "disconnect electrical components"}, {"action": '
    '"use OBJ [on OBJ]", "description": "use a device/item"}, {"action": "look around", "description": "describe '
    'the current room"}, {"action": "look at OBJ", "description": "describe an object in detail"}, {"action": '
    '"look in OBJ", "description": "describe a container\'s contents"}, {"action": "read OBJ", "description": '
    '"read a note or book"}, {"action": "move OBJ to OBJ", "description": "move an object to a container"}, '
    '{"action": "pick up OBJ", "description": "move an object to the inventory"}, {"action": "put down OBJ", '
    '"description": "drop an inventory item"}, {"action": "pour OBJ into OBJ", "description": "pour a liquid into '
    'a container"}, {"action": "dunk OBJ into OBJ", "description": "dunk a container into a liquid"}, {"action": '
    '"mix OBJ", "description": "chemically mix a container"}, {"action": "go to LOC", "description": "move to a new '
    'location"}, {"action": "eat OBJ", "description": "eat a food"}, {"action": "flush OBJ", "description": "flush '
    'a toilet"}, {"action": "focus on OBJ", "description": "signal intent on a task object"}, {"action": "wait", '
    '"description": "take no action for 10 iterations"}, {"action": "wait1", "description": "take no action for 1 '
    'iteration"}, {"action":"examine OBJ","description":"provides a description of the objects present on or in a '
    'receptacle."}, {"action": "task", "description": "describe current task"}, {"action": "inventory", '
    '"description": "list your inventory"}]\nYour response should use the following format:\nThought:\nyour '
    'thoughts.\n\nAction:\nyour next action'
    '\n\nThe action "valid actions" lists some actions possible here; it does not change the world but uses a turn.'
)


@dataclass(frozen=True)
class SciWorldOptions:
    """Options of `SciWorldEnv` (``envhub.env_options: {sciworld-v0: {...}}``)."""

    simplification: str = ""
    """ScienceWorld simplifications, comma-separated: ``easy`` (all of them) or any of
    teleportAction, selfWateringFlowerPots, openContainers, openDoors, noElectricalAction.
    Empty, AgentGym's choice: none."""

    max_jvms: int = 2
    """Most simulator JVMs this process runs (each ~0.4-0.6 GB, one per open session); the pool is
    process-wide, so every sciworld env id in one process must use the same value."""

    jvm_heap_mb: int = 512
    """Java heap cap of each JVM (``-Xmx``); without one a JVM's heap grows past 1 GB."""

    hint_max_actions: int = 30
    """Most actions the ``valid actions`` hint lists (a room can allow thousands)."""

    def __post_init__(self) -> None:
        if not isinstance(self.simplification, str):
            raise ValueError(f"sciworld: option simplification must be a string, got {self.simplification!r}")
        unknown = [name for name in self.simplification.split(",") if name and name not in SIMPLIFICATIONS]
        if unknown:
            raise ValueError(f"sciworld: unknown simplification(s) {unknown}; use a comma-separated subset of "
                             f"{', '.join(SIMPLIFICATIONS)}, or '' for none")
        for name, least in (("max_jvms", 1), ("jvm_heap_mb", 128), ("hint_max_actions", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"sciworld: option {name} must be an int >= {least}, got {value!r}")

    @classmethod
    def parse(cls, options: dict[str, Any]) -> SciWorldOptions:
        """Options from a mapping; unknown keys are an error naming the valid ones."""
        return parse_options(cls, options, "sciworld")


def first_observation(task_description: str, room: str) -> str:
    """The task and the room, as AgentGym's SciWorld server shows them (the instruction is the
    conversation start's)."""
    return f"{task_description.strip()}\n{room.strip()}"


def hint_text(valid_actions: list[str], max_actions: int) -> str:
    """Up to `max_actions` valid actions, taken in turn from each verb so that hundreds of
    ``connect X to Y`` do not crowd out the rest."""
    by_verb: dict[str, list[str]] = {}
    for action in valid_actions:
        if action not in REFUSED_COMMANDS:
            by_verb.setdefault(action.split(" ", 1)[0], []).append(action)
    queues = [by_verb[verb] for verb in sorted(by_verb)]
    chosen: list[str] = []
    for depth in range(max((len(queue) for queue in queues), default=0)):
        chosen += [queue[depth] for queue in queues if depth < len(queue)][: max_actions - len(chosen)]
    total = sum(len(queue) for queue in queues)
    return f"Some valid actions here ({len(chosen)} of {total}):\n" + "\n".join(sorted(chosen))


class SciWorldEnv(Environment):
    """One ScienceWorld episode at a time, on a JVM borrowed from the process-wide pool."""

    # Task 0 is `boil`: focusing on the agent is a wrong focus, so the script ends in a failure.
    example_actions = (
        "Thought: Let me see where I am.\nAction: look around",
        "Thought: The kitchen should have water.\nAction: open door to kitchen",
        "Thought: What can I do here?\nAction: valid actions",
        "Thought: I will focus on myself.\nAction: focus on agent",
    )

    def __init__(self, **options: Any) -> None:
        self.options = SciWorldOptions.parse(options)
        self._pool: JvmPool = get_pool(self.options.max_jvms, self.options.jvm_heap_mb)
        self._jvm: ScienceWorldJvm | None = None
        self._jvm_broken = False
        self._task: task_index.SciWorldTask | None = None
        self._best_score = 0
        self._done = True

    @classmethod
    def conversation_start(cls, **options: Any) -> ConversationStart:
        """AgentGym's instruction; no worked example yet."""
        SciWorldOptions.parse(options)
        return ConversationStart(INSTRUCTIONS)

    @property
    def jvm_pid(self) -> int | None:
        """Process id of the JVM this session holds (None before the first reset)."""
        return self._jvm.pid if self._jvm is not None else None

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        task = task_index.lookup(int(task_id))
        self._check_simplification_fits(task)
        if self._jvm_broken:
            await self.close()
        if self._jvm is None:
            self._jvm = await self._pool.borrow()
        description, room = await self._call(self._load, task)
        self._task, self._best_score, self._done = task, 0, False
        return first_observation(description, room), self._info(0, success=False)

    async def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        parsed = extract_action(action)
        if isinstance(parsed, MalformedAction):
            return self._unscored(parsed.feedback, malformed_action=True, action_parsed=False)
        command = " ".join(parsed.split())
        keyword = command.lower().rstrip(".!")
        if keyword in HINT_COMMANDS:
            valid_actions = await self._call(self._valid_actions)
            return self._unscored(hint_text(valid_actions, self.options.hint_max_actions), hint=True)
        if keyword in REFUSED_COMMANDS:
            return self._unscored("Resetting the task is not allowed here; the episode goes on.")
        observation, score, completed = await self._call(self._simulate, command)
        return self._scored(observation, score, completed)

    async def close(self) -> None:
        jvm, self._jvm, self._done = self._jvm, None, True
        broken, self._jvm_broken = self._jvm_broken, False
        if jvm is None:
            return
        if broken:
            await self._pool.discard(jvm)
        else:
            self._pool.give_back(jvm)

    def _check_simplification_fits(self, task: task_index.SciWorldTask) -> None:
        if "noElectricalAction" in self.options.simplification and any(
                mark in task.name for mark in ELECTRICAL_TASK_MARKS):
            raise OptionsError(f"sciworld: task {task.number} ({task.name}) needs electrical actions, but the "
                               f"simplification option removes them ({self.options.simplification!r})")

    async def _call(self, call: Callable[..., Result], *args: Any) -> Result:
        """Run a simulator call off the event loop; a failed or interrupted one marks the JVM broken."""
        try:
            return await self._pool.run(call, *args)
        except BaseException:
            self._jvm_broken = True
            raise

    # The three below run on the pool's threads.
    def _load(self, task: task_index.SciWorldTask) -> tuple[str, str]:
        jvm = self._jvm
        jvm.load(task.name, task.variation, self.options.simplification)
        return jvm.get_task_description(), jvm.look()  # look() is free: it takes no game time

    def _simulate(self, command: str) -> tuple[str, int, bool]:
        # Not ScienceWorldEnv.step: that also lists every valid action, the room and the
        # inventory on each step (up to ~0.5 s), which the agent never sees.
        server = self._jvm.server
        observation = server.step(command)
        return observation, round(MAX_SCORE * server.getScore()), bool(server.getCompleted())

    def _valid_actions(self) -> list[str]:
        return self._jvm.get_valid_action_object_combinations()

    def _scored(self, observation: str, score: int, completed: bool) -> StepResult:
        reached = min(max(score, 0), MAX_SCORE)
        reward = max(0, reached - self._best_score) / MAX_SCORE
        self._best_score = max(self._best_score, reached)
        success = completed and score >= MAX_SCORE
        self._done = completed or score < 0
        if self._done:
            outcome = "completed" if success else "failed"
            observation = f"{observation}\nThe task is {outcome} (score {score} of {MAX_SCORE})."
        return StepResult(observation, reward, self._done, False, self._info(score, success))

    def _unscored(self, observation: str, **flags: bool) -> StepResult:
        return StepResult(observation, 0.0, False, False, {**self._info(None, success=False), **flags})

    def _info(self, score: int | None, success: bool) -> dict[str, Any]:
        task = self._task
        info: dict[str, Any] = {"success": success, "best_score": self._best_score / MAX_SCORE, "action_parsed": True}
        if score is not None:
            info["score"] = score
        if task is not None:
            info.update(task_name=task.name, variation=task.variation, split=task.split)
        return info
