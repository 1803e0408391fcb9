"""sciworld-v0: ScienceWorld's science tasks (boil water, find a living thing, build a circuit...).

An episode:
1. ``reset(task_id, seed)``: borrow a simulator JVM from the process-wide pool (jvm_pool.py; the
   first reset of a session only), load the task's (task, variation) (task_index.py: the dialect
   fixes the task list and its numbering) with the configured simplifications; the first
   observation is the task description and the room. The seed is ignored: a variation fixes the world.
2. ``step(reply)``: the dialect's rules (agentgym_rules.py, lenient_rules.py) read the reply; a
   command goes to the simulator, and the rules turn its answer, score, completion and move count
   into the step's observation, reward and end.
3. Score: ScienceWorld's runs 0..100, and a negative one (-100) means the task failed. Rewards are
   the rises of the best clipped score / 100 (never negative, summing to at most 1); ``info["score"]``
   is ScienceWorld's score under ``agentgym``, the rewards' sum under ``lenient``.
4. ``close()``: give the JVM back for the next session, or kill it if a call failed or was
   interrupted (its state is unknown).

A session holds its JVM from reset to close, so ``max_jvms`` caps the concurrent ScienceWorld
episodes of one envhub process; a reset beyond the cap waits for a JVM within envhub's
``step_timeout_s`` (then 504). Give the process max_jvms >= its concurrent sciworld sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from envhub.base import ConversationStart, Environment, StepResult
from envhub.envs.sciworld import task_index
from envhub.envs.sciworld.agentgym_rules import AGENTGYM_INSTRUCTION, AgentGymRules
from envhub.envs.sciworld.example import WORKED_EXAMPLE
from envhub.envs.sciworld.jvm_pool import JvmPool, ScienceWorldJvm, get_pool
from envhub.envs.sciworld.lenient_rules import DEFAULT_HINT_MAX_ACTIONS, LENIENT_INSTRUCTION, LenientRules
from envhub.envs.sciworld.rules import MAX_SCORE, EpisodeRules, ListValidActions, Simulate, SimulatorState
from envhub.options import OptionsError, parse_options

Result = TypeVar("Result")
SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction")
ELECTRICAL_TASK_MARKS = ("power-component", "conductivity")  # as scienceworld's own load() checks


@dataclass(frozen=True)
class SciWorldOptions:
    """Options of `SciWorldEnv` (``envhub.env_options: {sciworld-v0: {...}}``)."""

    dialect: str = "agentgym"
    """``agentgym``: AgentGym's 23 tasks and their numbering, its reply parsing, observations and
    scores (agentgym_rules.py); ``lenient``: all 30 tasks, a forgiving parser and a hint action
    (lenient_rules.py)."""

    simplification: str = ""
    """ScienceWorld simplifications, comma-separated: ``easy`` (all of them) or any of
    teleportAction, selfWateringFlowerPots, openContainers, openDoors, noElectricalAction.
    Empty, AgentGym's choice: none."""

    max_jvms: int = 2
    """Most simulator JVMs this process runs (each ~0.4-0.6 GB, one per open session); the pool is
    process-wide, so every sciworld env id in one process must use the same value."""

    jvm_heap_mb: int = 512
    """Java heap cap of each JVM (``-Xmx``); without one a JVM's heap grows past 1 GB."""

    hint_max_actions: int | None = None
    """Most actions the ``valid actions`` hint lists (a room can allow thousands); lenient only
    (AgentGym has no hint action), default 30."""

    def __post_init__(self) -> None:
        task_index.index_for(self.dialect)  # raises on an unknown dialect, naming the choices
        if not isinstance(self.simplification, str):
            raise ValueError(f"sciworld: option simplification must be a string, got {self.simplification!r}")
        unknown = [name for name in self.simplification.split(",") if name and name not in SIMPLIFICATIONS]
        if unknown:
            raise ValueError(f"sciworld: unknown simplification(s) {unknown}; use a comma-separated subset of "
                             f"{', '.join(SIMPLIFICATIONS)}, or '' for none")
        for name, least in (("max_jvms", 1), ("jvm_heap_mb", 128), ("hint_max_actions", 1)):
            value = getattr(self, name)
            if name == "hint_max_actions" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"sciworld: option {name} must be an int >= {least}, got {value!r}")
        if self.dialect == "agentgym" and self.hint_max_actions is not None:
            raise ValueError("sciworld: option hint_max_actions applies to dialect lenient only "
                             "(AgentGym's server has no hint action)")

    @classmethod
    def parse(cls, options: dict[str, Any]) -> SciWorldOptions:
        """Options from a mapping; unknown keys are an error naming the valid ones."""
        return parse_options(cls, options, "sciworld")

    def new_rules(self) -> EpisodeRules:
        """Fresh rules for one episode under this dialect."""
        if self.dialect == "agentgym":
            return AgentGymRules()
        return LenientRules(self.hint_max_actions or DEFAULT_HINT_MAX_ACTIONS)


class SciWorldEnv(Environment):
    """One ScienceWorld episode at a time, on a JVM borrowed from the process-wide pool."""

    # Task 0 is `boil` in both dialects: focusing on the agent is a wrong focus, so the script fails.
    example_actions = (
        "Thought:\nLet me see where I am.\n\nAction:\nlook around",
        "Thought:\nThe kitchen should have water.\n\nAction:\nopen door to kitchen",
        "Thought:\nI will focus on myself.\n\nAction:\nfocus on agent",
    )

    def __init__(self, **options: Any) -> None:
        self.options = SciWorldOptions.parse(options)
        self._tasks = task_index.index_for(self.options.dialect)
        self._pool: JvmPool = get_pool(self.options.max_jvms, self.options.jvm_heap_mb)
        self._jvm: ScienceWorldJvm | None = None
        self._jvm_broken = False
        self._task: task_index.SciWorldTask | None = None
        self._rules: EpisodeRules | None = None
        self._done = True

    @classmethod
    def conversation_start(cls, **options: Any) -> ConversationStart:
        """Under agentgym, AgentGym's instruction word for word and one worked example in its grammar
        (example.py), shown only when the run asks (``rollout.num_examples``): AgentGym's evaluation
        shows none, and a model should be trained on the prompt it is scored on. Under lenient, that
        instruction plus a line on the hint action."""
        if SciWorldOptions.parse(options).dialect == "lenient":
            return ConversationStart(LENIENT_INSTRUCTION)
        return ConversationStart(AGENTGYM_INSTRUCTION, examples=(WORKED_EXAMPLE,), default_examples=0)

    @classmethod
    def task_splits(cls, **options: Any) -> dict[str, range | tuple[int, ...]]:
        """ScienceWorld's train/dev/test and ``all`` over the dialect's task list (task_index.py)."""
        return task_index.index_for(SciWorldOptions.parse(options).dialect).splits

    @property
    def jvm_pid(self) -> int | None:
        """Process id of the JVM this session holds (None before the first reset)."""
        return self._jvm.pid if self._jvm is not None else None

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        task = self._tasks.lookup(int(task_id))
        self._check_simplification_fits(task)
        if self._jvm_broken:
            await self.close()
        if self._jvm is None:
            self._jvm = await self._pool.borrow()
        rules = self.options.new_rules()
        description, room = await self._call(self._load, task, rules.opening_look_is_a_move)
        self._task, self._rules, self._done = task, rules, False
        observation, info = rules.first_observation(description, room)
        return observation, {**info, **self._task_info()}

    async def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        wanted = self._rules.interpret(action)
        if isinstance(wanted, ListValidActions):
            result = self._rules.after_hint(await self._call(self._valid_actions))
        elif isinstance(wanted, Simulate):
            state = await self._call(self._simulate, wanted.command)
            result = self._rules.after_command(state, wanted.action_parsed)
        else:
            result = wanted
        self._done = result.terminated or result.truncated
        return StepResult(result.observation, result.reward, result.terminated, result.truncated,
                          {**result.info, **self._task_info()})

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

    def _task_info(self) -> dict[str, Any]:
        task = self._task
        return {"task_name": task.name, "variation": task.variation, "split": task.split}

    async def _call(self, call: Callable[..., Result], *args: Any) -> Result:
        """Run a simulator call off the event loop; a failed or interrupted one marks the JVM broken."""
        try:
            return await self._pool.run(call, *args)
        except BaseException:
            self._jvm_broken = True
            raise

    # The three below run on the pool's threads.
    def _load(self, task: task_index.SciWorldTask, look_as_a_move: bool) -> tuple[str, str]:
        jvm = self._jvm
        jvm.load(task.name, task.variation, self.options.simplification)
        description = jvm.get_task_description()
        room = jvm.server.step("look around") if look_as_a_move else jvm.look()  # look() takes no game time
        return description, room

    def _simulate(self, command: str) -> SimulatorState:
        # Not ScienceWorldEnv.step: that also lists every valid action, the room and the
        # inventory on each step (up to ~0.5 s), which the agent never sees.
        server = self._jvm.server
        observation = server.step(command)
        return SimulatorState(observation, round(MAX_SCORE * server.getScore()), bool(server.getCompleted()),
                              int(server.getNumMoves()))

    def _valid_actions(self) -> list[str]:
        return self._jvm.get_valid_action_object_combinations()
