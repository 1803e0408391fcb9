"""``python -m envhub``: serve, list, check and count the tasks of registered environments.

    python -m envhub serve [--port 8000] [--runs-dir runs] [--config FILE] [--envhub.KEY VALUE ...]
    python -m envhub list  [--config FILE] [--section.key VALUE ...]
    python -m envhub check ENV_ID [--task T] [--seed S] [--action A ...] [--http] [--config FILE] [overrides]
    python -m envhub check --dialect agentgym [ENV_ID ...] [--config FILE] [overrides]
    python -m envhub tasks ENV_ID [--config FILE] [overrides]

Overrides use the run config's one grammar (common/config/), e.g. env options:
``--envhub.env_options '{textcraft-v0: {recipes_dir: /data/recipes}}'``.
``check`` runs the conformance checker (envhub/conformance.py) in this process, on the env
itself or, with ``--http``, through an envhub server started on a loopback port (which also
checks 409-after-end and that close releases the session). ``check --dialect agentgym`` plays each
env's AgentGym fidelity cases (envhub/fidelity.py: scripted episodes in AgentGym's grammar, with
AgentGym's answers read from its source) and prints every difference. ``tasks`` prints the task
count of every split under the configured options.
Exit codes: 0 ok, 1 the env failed the check, 2 usage error (unknown env id or task, bad config).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from typing import Any, Sequence

from common.config import Config, ConfigError, load_config
from common.config.command_line import parse_command_line
from envhub import fidelity, registry
from envhub.client import EnvClient
from envhub.conformance import ConformanceError, ConformanceReport, check_env
from envhub.envs.agentgym import register_configured_servers


class UsageError(Exception):
    """The command line names something that does not exist or does not fit."""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:  # the server has its own flags (--port, --config, ...)
        from envhub.main import main as serve_main
        serve_main(argv[1:])
        return 0
    args, overrides = parse_command_line(_parser(), argv)
    try:
        cfg = load_config(args.config, overrides)
        _register_configured_servers(cfg)
        return args.command(args, cfg)
    except (ConfigError, UsageError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _register_configured_servers(cfg: Config) -> None:
    try:
        register_configured_servers(cfg.envhub.env_options)
    except ValueError as error:  # a configured AgentGym server whose options do not hold
        raise UsageError(str(error)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m envhub", allow_abbrev=False,
                                     description="envhub environments: serve, list, check, tasks.",
                                     epilog="Config overrides: --section.key value (e.g. --envhub.env_options).")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    commands.add_parser("serve", help="run an envhub server (see python -m envhub serve --help)")
    listing = commands.add_parser("list", help="registered env ids, turn caps and task counts", allow_abbrev=False)
    listing.set_defaults(command=run_list)
    check = commands.add_parser("check", help="run the conformance checker on one env, or with --dialect "
                                "agentgym the AgentGym fidelity cases of some or all envs", allow_abbrev=False)
    check.add_argument("env_ids", nargs="*", metavar="ENV_ID")
    check.add_argument("--dialect", choices=["agentgym"],
                       help="play the fidelity cases of the AgentGym dialect (default: every env that has them)")
    check.add_argument("--task", help="task id (default: the first task of split train, else of the first split)")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--action", action="append", dest="actions",
                       help="a valid action to try (repeat for a script; default: the env's example actions)")
    check.add_argument("--http", action="store_true", help="check through an envhub server on a loopback port")
    check.set_defaults(command=run_check)
    tasks = commands.add_parser("tasks", help="number of tasks per split of one env", allow_abbrev=False)
    tasks.add_argument("env_id")
    tasks.set_defaults(command=run_tasks)
    for sub in (listing, check, tasks):
        sub.add_argument("--config", help="a run config YAML (its envhub section is used)")
    return parser


def env_options(cfg: Config, env_id: str) -> dict[str, Any]:
    """The configured constructor options of `env_id`; raises UsageError for an unknown id."""
    try:
        registry.spec(env_id)
    except registry.UnknownEnvError as error:
        raise UsageError(str(error)) from None
    return dict(cfg.envhub.env_options.get(env_id, {}))


def task_splits(env_id: str, options: dict[str, Any]) -> dict[str, range | list[int]]:
    try:
        return registry.task_splits(env_id, **options)
    except Exception as error:  # an env that needs options (a data folder, a server URL)
        raise UsageError(f"{env_id}: cannot list its tasks under options {options}: {error}") from None


def describe_numbers(numbers: range | list[int]) -> str:
    if isinstance(numbers, range) and numbers.step == 1:
        return f"{numbers.start}..{numbers.stop - 1}"
    return f"ids {min(numbers)}..{max(numbers)}"


def run_tasks(args: argparse.Namespace, cfg: Config) -> int:
    splits = task_splits(args.env_id, env_options(cfg, args.env_id))
    print(f"{args.env_id}: max_turns {registry.spec(args.env_id).max_turns}")
    for name, numbers in splits.items():
        print(f"  {name:<12} {len(numbers):>8} tasks  {describe_numbers(numbers)}")
    print(f"  {'total':<12} {sum(len(numbers) for numbers in splits.values()):>8} tasks")
    return 0


def run_list(args: argparse.Namespace, cfg: Config) -> int:
    for env_spec in registry.list_specs():
        options = cfg.envhub.env_options.get(env_spec.id, {})
        try:
            counts = ", ".join(f"{name} {len(numbers)}" for name, numbers in task_splits(env_spec.id, options).items())
        except UsageError:
            counts = "tasks depend on env_options that are not set"
        print(f"{env_spec.id:<20} max_turns {env_spec.max_turns:<4} {counts}")
    return 0


def run_check(args: argparse.Namespace, cfg: Config) -> int:
    if args.dialect:
        if args.http or args.task is not None or args.actions:
            raise UsageError("--dialect agentgym plays its own scripted cases in-process: "
                             "--http, --task and --action do not apply")
        return run_fidelity(args.env_ids or list(fidelity.FIDELITY_MODULES), cfg)
    if len(args.env_ids) != 1:
        raise UsageError("check takes one ENV_ID (several only with --dialect agentgym)")
    args.env_id = args.env_ids[0]
    options = env_options(cfg, args.env_id)
    splits = task_splits(args.env_id, options)
    default_split = splits.get("train") or next(iter(splits.values()))
    task_id = args.task if args.task is not None else str(next(iter(default_split)))
    if not registry.spec(args.env_id).has_task(task_id, splits):
        known = ", ".join(f"{name}: {describe_numbers(numbers)}" for name, numbers in splits.items())
        raise UsageError(f"{args.env_id} has no task {task_id!r}; tasks: {known}")
    where = "over HTTP" if args.http else "in-process"
    try:
        report = asyncio.run(_check(args, cfg, options, task_id))
    except ConformanceError as error:
        print(f"FAIL {args.env_id} ({where}, task {task_id}, seed {args.seed}): {error}")
        return 1
    except Exception as error:  # the env (or its server) raised: it fails the check, not the CLI
        print(f"FAIL {args.env_id} ({where}, task {task_id}, seed {args.seed}): "
              f"the env raised {type(error).__name__}: {error}")
        return 1
    print(_report_line(report, where, task_id, args.seed))
    return 0


async def _check(args: argparse.Namespace, cfg: Config, options: dict[str, Any], task_id: str) -> ConformanceReport:
    if not args.http:
        env = registry.make(args.env_id, **options)
        return await check_env(env, args.env_id, task_id=task_id, seed=args.seed, actions=args.actions)
    from envhub.main import EnvhubServer  # imports uvicorn: only when a server is wanted

    server = EnvhubServer(dataclasses.replace(cfg.envhub, host="127.0.0.1", port=0))
    await asyncio.to_thread(server.start_in_thread)
    try:
        async with EnvClient(server.base_url) as client:
            return await check_env(client, args.env_id, task_id=task_id, seed=args.seed, actions=args.actions)
    finally:
        await asyncio.to_thread(server.stop)


def run_fidelity(env_ids: list[str], cfg: Config) -> int:
    """Play every fidelity case of ``env_ids`` in-process; 1 when any differs from AgentGym."""
    failed = 0
    for env_id in env_ids:
        options = env_options(cfg, env_id)
        try:
            cases = fidelity.cases_for(env_id)
        except LookupError as error:
            raise UsageError(str(error)) from None
        for case in cases:
            problems = asyncio.run(_play_fidelity_case(env_id, {**options, **case.options}, case))
            failed += bool(problems)
            print(f"{'FAIL' if problems else 'PASS'} {env_id} {case.name} (task {case.task_id})")
            for problem in problems:
                print(f"    {problem}")
    return 1 if failed else 0


async def _play_fidelity_case(env_id: str, options: dict[str, Any], case: fidelity.FidelityCase) -> list[str]:
    env = registry.make(env_id, **{**options, "dialect": "agentgym"})
    try:
        return await fidelity.play_case(env, case)
    except Exception as error:  # the env raised: that case fails, the others still run
        return [f"{case.name}: the env raised {type(error).__name__}: {error}"]
    finally:
        await env.close()


def _report_line(report: ConformanceReport, where: str, task_id: str, seed: int) -> str:
    ending = f"reached a terminal step (success={report.success})" if report.reached_terminal else "no terminal step"
    return f"PASS {report.env_id} ({where}, task {task_id}, seed {seed}): {report.steps_taken} steps, {ending}"
