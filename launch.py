"""Launch a longhorizon run: envhub, the learner and M actors as Ray processes.

1. Resolve the config (YAML + flags + ``--section.key value`` overrides) and write it to
   ``<output_dir>/<run_name>/config.yaml``.
2. Start a fresh Ray cluster on 127.0.0.1, or join a running one (``--ray-address``), compute the
   placement plan for its nodes (``launcher/placement.py``) and create its placement groups.
3. Start the envhub servers, then the learner ranks (rank 0 binds the sockets), then the actors,
   each pointed at the learner and at its envhub server (round-robin).
4. Print a progress line every few seconds; restart a dead actor or envhub server; when another
   role dies, stop everything and print which role, its log path and the last lines of its log;
   Ctrl-C or SIGTERM: the learner saves a checkpoint, then everything shuts down.

    python launch.py                                   # the default CPU job
    python launch.py --config configs/smoke.yaml       # 90-second smoke run
    python launch.py --actors 4 --learner.lr 3e-4      # flags and overrides
    python launch.py --run-name r1 --resume            # continue runs/r1 from its last checkpoint
    python launch.py --mode sync                       # the synchronous loop, for comparison
    python launch.py --replay runs/r1/trajectories     # the learner alone, on a recorded stream
    python launch.py --config configs/babyai.yaml --evaluate runs/r1/checkpoints/step_000030/hf \
        --rollout.eval_greedy true --learner.eval_samples 1   # score a model on held-out tasks only
    python launch.py --actors 64 --learner-gpus 8 --dry-run --cluster 9x8gpu,64cpu   # print the plan
    python launch.py --ray-address auto --actors 64 --learner-gpus 8   # on a `ray start` cluster
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent
ROLE_ENV = {
    "PYTHONPATH": str(REPO),
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
LOCAL_ROLE_ENV = {"GLOO_SOCKET_IFNAME": "lo"}  # one machine: collectives over loopback
for _key, _value in ROLE_ENV.items():
    os.environ.setdefault(_key, _value)

from common.config import Config, write_resolved  # noqa: E402
from common.config.command_line import load_or_exit, parse_command_line  # noqa: E402
from common.config.horizon import HorizonConfig  # noqa: E402


def evaluate_overrides(model: str) -> list[str]:
    """``--evaluate MODEL``: zero learner steps and the one validation round, waited for, on MODEL
    (a run of no steps draws no training tasks: ``TaskSampler.draw_training``)."""
    if Path(model).expanduser().exists():  # a folder: the roles start in the repository root, not here
        model = str(Path(model).expanduser().resolve())
    return ["--model.name", model, "--model.warm_start", "", "--run.max_steps", "0", "--learner.eval_every", "0",
            "--learner.eval_at_start", "false", "--learner.eval_at_end", "true"]


FLAG_TO_KEY = {"actors": "actors.count", "learner_gpus": "learner.num_ranks", "max_steps": "run.max_steps",
               "output_dir": "run.output_dir", "run_name": "run.run_name", "mode": "run.mode"}


def parse_args(argv: list[str]) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Any other --section.key value overrides that config key.")
    parser.add_argument("--config", default=str(REPO / "configs" / "default.yaml"), help="YAML config file")
    parser.add_argument("--actors", type=int, help="number of actor processes")
    parser.add_argument("--learner-gpus", type=int, help="learner ranks (GPUs, or CPU processes without GPUs)")
    parser.add_argument("--max-steps", type=int, help="learner steps")
    parser.add_argument("--output-dir", help="folder holding the run folders")
    parser.add_argument("--run-name", help="name of this run's folder")
    parser.add_argument("--mode", choices=("async", "sync"), help="async (default) or the synchronous "
                        "reference loop on the same parts (generate a batch, wait for it, train, broadcast)")
    parser.add_argument("--resume", action="store_true", help="continue --run-name from its latest checkpoint")
    parser.add_argument("--replay", metavar="TRAJECTORIES", help="train on a recorded stream; no actors, no envhub")
    parser.add_argument("--evaluate", metavar="MODEL", help="score MODEL (a checkpoint's hf/ folder, a model "
                        "folder or a known name) on the config's held-out tasks and stop: no training step. "
                        "learner.eval_split / eval_tasks_per_env / eval_samples and rollout.eval_greedy choose "
                        "the tasks and the sampling")
    parser.add_argument("--ray-address", metavar="auto|HOST:PORT",
                        help="join a running Ray cluster (`ray start --head`) instead of a fresh local one")
    parser.add_argument("--dry-run", action="store_true", help="print the placement plan and start nothing")
    parser.add_argument("--cluster", metavar="NODES", help="--dry-run for a described cluster, e.g. 9x8gpu,64cpu "
                        "or 1x32cpu+8x8gpu,96cpu (default: this machine, or the --ray-address cluster)")
    args, rest = parse_command_line(parser, argv)
    if args.resume and not args.run_name:
        parser.error("--resume needs --run-name: the run folder to continue")
    if args.cluster and not args.dry_run:
        parser.error("--cluster describes a cluster for --dry-run; a real run uses Ray's nodes (--ray-address)")
    overrides = list(rest)
    if args.resume:
        overrides += ["--run.resume", "true"]
    if args.replay:
        overrides += ["--run.replay", str(Path(args.replay).resolve())]
    if args.evaluate:
        if args.resume or args.replay or args.max_steps:
            parser.error("--evaluate trains nothing: it takes no --resume, --replay or --max-steps")
        overrides = evaluate_overrides(args.evaluate) + overrides  # the user's own overrides come after
    for flag, key in FLAG_TO_KEY.items():
        if getattr(args, flag) is not None:
            overrides += [f"--{key}", str(getattr(args, flag))]
    cfg = load_or_exit(parser, args.config, overrides)
    return (at_longest_horizon(cfg) if args.evaluate else cfg), args


def at_longest_horizon(cfg: Config) -> Config:
    """An evaluation plays at the schedule's longest turn cap (each env's own limit where lower),
    the horizon a trained model ends at, rather than at the cap of step 0."""
    longest = HorizonConfig(kind="fixed", turn_caps=[max(cfg.learner.horizon.turn_caps)], boundaries=[])
    return replace(cfg, learner=replace(cfg.learner, horizon=longest))


def run_dir_of(cfg: Config) -> Path:
    kind = "eval" if cfg.run.max_steps == 0 else "run"
    name = cfg.run.run_name or time.strftime(f"{kind}-%Y%m%d-%H%M%S")
    run_dir = Path(cfg.run.output_dir).expanduser().resolve() / name
    if cfg.run.resume and not run_dir.is_dir():
        sys.exit(f"launch: --resume: no run folder {run_dir}")
    return run_dir


def make_run_dir(cfg: Config, run_dir: Path) -> Path:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    write_resolved(cfg, run_dir / ("config.resumed.yaml" if cfg.run.resume else "config.yaml"))
    return run_dir


def dry_run(cfg: Config, args: argparse.Namespace) -> int:
    """Print the placement plan for ``--cluster``, the ``--ray-address`` cluster or this machine."""
    from launcher.placement import PlacementError, format_plan, local_cluster, parse_cluster, plan_placement

    try:
        if args.cluster:
            cluster = parse_cluster(args.cluster)
        else:
            from launcher import ray_cluster  # imports Ray only when it has to look at a cluster

            if args.ray_address:
                cluster = ray_cluster.join(args.ray_address, {})
            else:
                cluster = local_cluster(cfg, os.cpu_count() or 1, ray_cluster.gpus_here())
        plan = plan_placement(cluster, cfg)
        print(format_plan(plan))
        if plan.on_gpus and cfg.actors.engine == "vllm":
            from actors.build_engine import vllm_serving_dtype
            from common.models import local_model_config
            from launcher.gpu_memory import actor_gpu_memory

            model = local_model_config(cfg.model.name, cfg.model.cache_dir)
            print("  " + actor_gpu_memory(model, cfg, vllm_serving_dtype(cfg, on_gpu=True)))
    except (PlacementError, ConnectionError) as exc:  # ConnectionError: no Ray cluster at --ray-address
        print(f"launch: {exc}", file=sys.stderr)
        return 2
    return 0


def with_warm_model(cfg: Config) -> Config:
    """``model.warm_start``: make (or find in the cache) the warm model and train from its folder."""
    if not cfg.model.warm_start:
        return cfg
    from launcher.warm_start import cached_warm_model  # imports torch: only when a run needs it

    print("warm start: a short supervised pass of the tiny model on random admissible keydoor actions "
          "(once, ~95 s on 2 cores; then cached) ...", flush=True)
    path = cached_warm_model(cfg)
    print(f"warm start: {path}", flush=True)
    return replace(cfg, model=replace(cfg.model, name=str(path), warm_start=""))


def main(argv: list[str]) -> int:
    cfg, args = parse_args(argv)
    if args.dry_run:
        return dry_run(cfg, args)
    run_dir = run_dir_of(cfg)
    cfg = with_warm_model(cfg)
    from launcher.placement import PlacementError
    from launcher.supervisor import Supervisor  # imports Ray: keep --help fast

    # On a cluster the collectives' interface is the nodes' own business (set it in their environment).
    role_env = {**ROLE_ENV, **({} if args.ray_address else LOCAL_ROLE_ENV)}
    try:
        with Supervisor(cfg, run_dir, role_env, args.ray_address) as supervisor:  # placed: nothing runs yet
            make_run_dir(cfg, run_dir)
            print(f"run folder: {run_dir}\ntensorboard: tensorboard --logdir {run_dir / 'tb'}", flush=True)
            return supervisor.run()
    except (PlacementError, ConnectionError) as exc:  # ConnectionError: no Ray cluster at --ray-address
        print(f"launch: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
