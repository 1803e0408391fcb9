"""The launcher's process lifecycle on Ray: place the roles, start them, watch them, fail fast.

Ray is a fresh local cluster, or a running one (``ray_address``). The placement plan
(``launcher/placement.py``) is computed for its nodes and realised as placement groups;
every role runs in its own Ray worker, in its plan bundle, through ``RoleHost`` and logs to
``<run>/logs/<role>-<i>.log``. A dead actor or envhub server is restarted in the same bundle (up to
``actors.max_restarts`` / ``envhub.max_restarts``), unless it died of a ``ConfigError`` (it would
again); any other role dying stops the run, and the console gets its name, its log path and the last
lines of its log rather than a wall of Ray traceback.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray

from common.config import Config, ConfigError
from common.net import free_port
from common.run_folder import latest_complete
from launcher import ray_cluster
from launcher.placement import PlacementPlan, format_plan, local_cluster, plan_placement
from launcher.roles import RoleHost

LOG_TAIL_LINES = 25


@dataclass
class Role:
    name: str
    handle: Any
    log_path: Path
    factory: str = ""
    args: tuple = ()


class RoleFailed(Exception):
    def __init__(self, role: Role, reason: str):
        super().__init__(f"{role.name} {reason}")
        self.role, self.reason = role, reason


class Supervisor:
    def __init__(self, cfg: Config, run_dir: Path, role_env: dict[str, str], ray_address: str | None = None):
        self.cfg, self.run_dir, self.role_env, self.ray_address = cfg, run_dir, role_env, ray_address
        self.roles: list[Role] = []
        self._finished_early: dict = {}
        self._last_printed_step = 0
        self._learner_run = None
        self._services: dict[Any, Role] = {}  # pending watch() ref -> envhub server
        self._envhub_urls: dict[str, str] = {}
        self._restarts: Counter[str] = Counter()
        self.restart_times_s: list[float] = []
        self.envhub_restart_times_s: list[float] = []
        self._host = ray.remote(RoleHost)
        self.plan: PlacementPlan | None = None
        self._groups: ray_cluster.PlacementGroups | None = None

    def __enter__(self) -> "Supervisor":
        try:
            if self.ray_address:
                cluster = ray_cluster.join(self.ray_address, self.role_env)
            else:
                cluster = local_cluster(self.cfg, os.cpu_count() or 1, ray_cluster.gpus_here())
                ray_cluster.start_local(cluster, self.role_env)
            self.plan = plan_placement(cluster, self.cfg)
            print(format_plan(self.plan), flush=True)
            self._groups = ray_cluster.PlacementGroups(self.plan)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for role in self.roles:
            ray.kill(role.handle, no_restart=True)
        if self._groups is not None:
            self._groups.remove()
        ray.shutdown()

    def start_role(self, name: str, factory: str, *args: Any) -> Role:
        """Start ``name`` in its plan bundle (the same bundle again when it is restarted)."""
        log_path = self.run_dir / "logs" / f"{name}.log"
        options = self._groups.options(name)
        handle = self._host.options(max_concurrency=4, name=None, **options).remote(str(log_path), factory, *args)
        role = Role(name, handle, log_path, factory, args)
        self.roles.append(role)
        return role

    def _host_of(self, role_name: str) -> str:
        """Address a service of ``role_name`` binds: loopback locally, its node's IP on a cluster."""
        return self._groups.node_address(role_name) if self.ray_address else "127.0.0.1"

    def call(self, role: Role, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        return self._get(role.handle.call.remote(method, *args), role, method, timeout_s)

    def run(self) -> int:
        stopped_by = _stop_on_signals()
        try:
            summary = self._start_and_watch()
        except RoleFailed as failure:
            self._report_failure(failure)
            return 1
        except KeyboardInterrupt:
            signum = stopped_by[-1] if stopped_by else signal.SIGINT
            print(f"\ninterrupted ({signal.Signals(signum).name}): asking the learner to save and stop (again to "
                  "kill)", flush=True)
            self._stop_gracefully()
            return 128 + signum
        _print_summary(summary, self.run_dir)
        return 0

    def _start_and_watch(self) -> dict:
        cfg, live = self.cfg, not self.cfg.run.replay
        urls = self._start_envhubs() if live else []
        learner, addresses = self._start_learner(urls)
        actors = [self.start_role(f"actor-{k}", "actors.main:Actor", cfg, k, addresses,
                                  urls[self.plan.envhub_of_actor[k]]) for k in range(cfg.actors.count if live else 0)]
        print(f"started {f'{len(urls)} envhub server(s), ' if live else ''}{cfg.learner.num_ranks} learner rank(s) "
              f"and {len(actors)} actor(s); waiting for the first batch ...", flush=True)
        if urls:
            print(f"envhub servers: {' '.join(urls)}", flush=True)
        self._learner_run = learner.handle.call.remote("run")
        runs = {self._learner_run: learner}
        runs.update({r.handle.call.remote("run"): r for r in self.roles
                     if r is not learner and not r.name.startswith("envhub-")})
        summary = self._watch(runs, learner)
        summary["actors"] = self._wait_actors(runs, learner)
        summary["actor_restarts"] = {"count": len(self.restart_times_s), "times_s": self.restart_times_s}
        summary["envhub_restarts"] = {"count": len(self.envhub_restart_times_s), "times_s": self.envhub_restart_times_s}
        for service in self._services.values():
            self.call(service, "stop", timeout_s=30)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        return summary

    def _start_envhubs(self) -> list[str]:
        """Start every envhub server of the plan at once; returns their URLs, server s at index s."""
        servers = max(self.plan.envhub_of_actor, default=-1) + 1
        hosts = [self._host_of(f"envhub-{s}") if self.ray_address else self.cfg.envhub.host for s in range(servers)]
        runs_dir = str(self.run_dir.parent.resolve())  # the trajectory viewer (/ui) browses this run's siblings
        roles = [self.start_role(f"envhub-{s}", "envhub.main:EnvhubServer",
                                 replace(self.cfg.envhub, host=host, runs_dir=runs_dir))
                 for s, host in enumerate(hosts)]
        refs = {role.handle.call.remote("start_in_thread"): role for role in roles}
        for ref, role in refs.items():
            port = self._get(ref, role, "start_in_thread", timeout_s=120)
            role.args = (replace(role.args[0], port=port),)  # a restart binds the same port again
            self._envhub_urls[role.name] = _url(role.args[0].host, port)
            self._services[role.handle.watch.remote()] = role
        return [self._envhub_urls[role.name] for role in roles]

    def _start_learner(self, envhub_urls: list[str]) -> tuple[Role, dict]:
        """Rank 0 and the followers set up together: their process group forms across all of them."""
        host = self._host_of("learner-0")
        master = (host, free_port())  # the ranks share one node (STRICT_PACK)
        learner = self.start_role("learner-0", "learner.main:Learner", self.cfg, str(self.run_dir), envhub_urls,
                                  master, host)
        followers = [self.start_role(f"learner-{rank}", "learner.follower:Follower", self.cfg, str(self.run_dir),
                                     rank, master) for rank in range(1, self.cfg.learner.num_ranks)]
        refs = {role.handle.call.remote("setup"): role for role in (learner, *followers)}
        for ref, role in refs.items():
            result = self._get(ref, role, "setup", timeout_s=600)
            if role is learner:
                addresses = result
        return learner, addresses

    def _get(self, ref: Any, role: Role, method: str, timeout_s: float | None) -> Any:
        try:
            return ray.get(ref, timeout=timeout_s)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as exc:
            raise RoleFailed(role, f"failed in {method}(): {_last_line(exc)}") from None

    def _watch(self, runs: dict, learner: Role) -> dict:
        """Print progress until the learner returns; any other role returning first is a failure."""
        interval = self.cfg.run.progress_interval_s
        while True:
            watching = [ref for ref in runs if ref not in self._finished_early] + list(self._services)
            done, _ = ray.wait(watching, num_returns=1, timeout=interval)
            for ref in done:
                if ref in self._services:
                    self._on_service_died(ref)
                    continue
                role = runs[ref]
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    if _is_config_error(exc) or not self._may_restart(role):
                        raise RoleFailed(role, f"died: {_last_line(exc)}") from None
                    del runs[ref]
                    replacement = self._restart_actor(role, learner, _last_line(exc))
                    runs[replacement.handle.call.remote("run")] = replacement
                    continue
                if role is learner:
                    return result
                if result.get("stopped_by") != "head":
                    raise RoleFailed(role, "exited before the learner finished")
                self._finished_early[ref] = result  # the head already said stop; the learner is saving
            self._print_progress(learner)

    def _may_restart(self, role: Role) -> bool:
        limit = {"actor": self.cfg.actors.max_restarts, "envhub": self.cfg.envhub.max_restarts}
        return self._restarts[role.name] < limit.get(role.name.split("-")[0], 0)

    def _on_service_died(self, ref: Any) -> None:
        """``watch()`` only ends when the server's process does: restart it or fail the run."""
        role = self._services.pop(ref)
        config_error = False
        try:
            ray.get(ref)
            reason = "returned"
        except ray.exceptions.RayError as exc:
            reason, config_error = _last_line(exc), _is_config_error(exc)
        if config_error or not self._may_restart(role):
            raise RoleFailed(role, f"died: {reason}")
        self._restart_envhub(role, reason)

    def _retire(self, role: Role, reason: str, max_restarts: int) -> None:
        """Count the restart, say so, and make sure the dead role's process is gone."""
        self._restarts[role.name] += 1
        print(f"{role.name} died ({reason}); restarting ({self._restarts[role.name]}/{max_restarts}), "
              f"log: {role.log_path}", flush=True)
        self.roles.remove(role)
        ray.kill(role.handle, no_restart=True)

    def _restart_envhub(self, role: Role, reason: str) -> None:
        """Same bundle, same port: the actors' URLs stay valid. Episodes that were running on it have
        ended with ``env_error``; new ones wait for it (``actors.env_reconnect_s``)."""
        started = time.monotonic()
        self._retire(role, reason, self.cfg.envhub.max_restarts)
        replacement = self.start_role(role.name, role.factory, *role.args)
        self.call(replacement, "start_in_thread", timeout_s=120)
        self._services[replacement.handle.watch.remote()] = replacement
        self.envhub_restart_times_s.append(time.monotonic() - started)
        print(f"{role.name} restarted in {self.envhub_restart_times_s[-1]:.1f} s at "
              f"{self._envhub_urls[role.name]}", flush=True)

    def _restart_actor(self, role: Role, learner: Role, reason: str) -> Role:
        """Re-issue the dead actor's leases, then start it again under the same id; it joins the
        next weight group and continues from the learner's current version."""
        started = time.monotonic()
        self._retire(role, reason, self.cfg.actors.max_restarts)
        actor_id = int(role.name.split("-")[1])
        reissued = self.call(learner, "actor_lost", actor_id, timeout_s=30)
        replacement = self.start_role(role.name, role.factory, *role.args)
        ray.get(replacement.handle.pid.remote(), timeout=120)  # the process is up and logging
        self.restart_times_s.append(time.monotonic() - started)
        print(f"{role.name} restarted in {self.restart_times_s[-1]:.1f} s; {reissued} lease(s) re-issued", flush=True)
        return replacement

    def _wait_actors(self, runs: dict, learner: Role, timeout_s: float = 60.0) -> list[dict]:
        """Actors and followers stop on the learner's word; collect their summaries. The word is one
        message on the control channel: an actor restarted late (still starting when it was sent)
        never hears it, so every actor is also told directly."""
        results = list(self._finished_early.values())
        pending = [ref for ref, role in runs.items() if role is not learner and ref not in self._finished_early]
        for ref in pending:
            if runs[ref].name.startswith("actor-"):
                runs[ref].handle.call.remote("stop")  # answered at once; its run() then returns
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout_s)
        for ref in done:
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayError as exc:
                raise RoleFailed(runs[ref], f"failed while stopping: {_last_line(exc)}") from None
        return results

    def _print_progress(self, learner: Role) -> None:
        try:
            p = ray.get(learner.handle.call.remote("progress"), timeout=5)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            return  # the run() ref reports a dead learner
        if p.get("step", 0) == self._last_printed_step:
            return
        self._last_printed_step = p.get("step", 0)
        valid = f"  valid_actions {p['valid_action_frac']:.2f}" if p.get("valid_action_frac") is not None else ""
        print(f"step {p['step']}/{p['max_steps']}  reward {p['reward']:.3f}  success {p['success']:.2f} "
              f"(first 3 steps {p['success_first_steps']:.2f}, last 3 {p['success_last_steps']:.2f}){valid}  "
              f"turn_cap {p['turn_cap']}  samples/s {p['samples_per_s']:.1f}  policy_lag {p['policy_lag']:.2f}",
              flush=True)

    def _stop_gracefully(self, timeout_s: float = 60.0) -> None:
        """The learner saves a checkpoint and tells the actors to stop; then everything is killed."""
        learner = next((r for r in self.roles if r.name.startswith("learner")), None)
        if learner is None or self._learner_run is None:
            return
        try:
            learner.handle.call.remote("request_stop")
            summary = ray.get(self._learner_run, timeout=timeout_s)
            print(f"stopped at step {summary.get('step')}; checkpoint: {summary.get('checkpoint')}", flush=True)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError, KeyboardInterrupt):
            print("the learner did not stop in time; killing every role", flush=True)

    def _report_failure(self, failure: RoleFailed) -> None:
        path = failure.role.log_path
        print(f"\nFAILED: {failure.role.name} {failure.reason}\nlog: {path}", flush=True)
        if path.exists():
            tail = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            print("---- last lines ----\n" + "\n".join(tail) + "\n--------------------", flush=True)
        checkpoint = latest_complete(self.run_dir)
        if failure.role.name.startswith("learner") and checkpoint is not None:
            print(f"latest checkpoint: {checkpoint}\nresume with: python launch.py --output-dir "
                  f"{self.run_dir.parent} --run-name {self.run_dir.name} --resume [same flags]", flush=True)


def _stop_on_signals() -> list[int]:
    """Ctrl-C and a plain ``kill`` both stop the run the graceful way (the learner saves, then
    everything shuts down); returns the list the handler appends each signal to. SIGINT is set
    explicitly because a shell starts a background job (``nohup python launch.py &``) with SIGINT
    ignored and Python keeps it so: ``kill -INT`` would then do nothing at all."""
    received: list[int] = []

    def interrupt(signum: int, _frame: Any) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, interrupt)
    return received


def _is_config_error(exc: BaseException) -> bool:
    """A role that died of its run's config dies again on every restart: fail the run at once.
    Ray raises the role's own exception class mixed into its ``RayTaskError``."""
    return isinstance(exc, ConfigError) or isinstance(getattr(exc, "cause", None), ConfigError)


def _last_line(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__


def _print_summary(summary: dict, run_dir: Path) -> None:
    ledger = summary.get("ledger", {})
    trend = (f" (mean of the first 3 steps {summary['success_first_steps']:.2f}, of the last 3 "
             f"{summary['success_last_steps']:.2f})" if "success_first_steps" in summary else "")
    print(f"\ndone: {summary.get('step')} learner steps in {summary.get('wall_s', 0):.1f} s; "
          f"final reward {summary.get('reward', 0):.3f}, success {summary.get('success', 0):.2f}{trend}\n"
          f"leases: {ledger}\ncheckpoint: {summary.get('checkpoint')}\nrun folder: {run_dir}", flush=True)
    for line in held_out_lines(summary.get("eval", [])):
        print(line, flush=True)


def held_out_lines(rounds: list[dict]) -> list[str]:
    """One line per env for the first and the last validation round: success and AgentGym's Avg/Pass."""
    picked = rounds[:1] + rounds[-1:] if len(rounds) > 1 else rounds
    lines = []
    for scalars in picked:
        envs = sorted({key.split("/")[1] for key in scalars if key.startswith("eval/") and key.count("/") == 2})
        for env_id in envs:
            def get(name: str) -> float:
                return scalars.get(f"eval/{env_id}/{name}", float("nan"))

            lines.append(f"held-out {env_id} at step {scalars['step']}: success {get('success'):.3f}, "
                         f"pass@n {get('pass@n'):.3f}, AgentGym Avg {get('agentgym_avg@n'):.3f} "
                         f"Pass {get('agentgym_pass@n'):.3f}, turns {get('num_turns'):.1f}, "
                         f"errors {get('error_frac'):.2f} ({get('tasks'):.0f} tasks)")
    return lines


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
