"""Launch a longhorizon run: envhub, the learner and M actors as Ray processes.

1. Resolve the config (YAML + flags + ``--section.key value`` overrides) and write it to
   ``<output_dir>/<run_name>/config.yaml``.
2. Start Ray locally on 127.0.0.1, then envhub, then the learner (which binds its sockets),
   then the actors pointed at both.
3. Print a progress line every few seconds; when a role dies, stop everything and print which
   role, its log path and the last lines of its log; Ctrl-C shuts everything down cleanly.

    python launch.py                                   # the default CPU job
    python launch.py --config configs/smoke.yaml       # 90-second smoke run
    python launch.py --actors 4 --learner.lr 3e-4      # flags and overrides
    python launch.py --run-name r1 --resume            # continue runs/r1 from its last checkpoint
    python launch.py --replay runs/r1/trajectories     # the learner alone, on a recorded stream
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent
ROLE_ENV = {
    "PYTHONPATH": str(REPO),
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "GLOO_SOCKET_IFNAME": "lo",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
for _key, _value in ROLE_ENV.items():
    os.environ.setdefault(_key, _value)

from common.config import Config, ConfigError, load_config, write_resolved  # noqa: E402

FLAG_TO_KEY = {"actors": "actors.count", "learner_gpus": "learner.num_ranks", "max_steps": "run.max_steps",
               "output_dir": "run.output_dir", "run_name": "run.run_name"}


def parse_args(argv: list[str]) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Any other --section.key value overrides that config key.")
    parser.add_argument("--config", default=str(REPO / "configs" / "default.yaml"), help="YAML config file")
    parser.add_argument("--actors", type=int, help="number of actor processes")
    parser.add_argument("--learner-gpus", type=int, help="learner ranks (GPUs, or CPU processes without GPUs)")
    parser.add_argument("--max-steps", type=int, help="learner steps")
    parser.add_argument("--output-dir", help="folder holding the run folders")
    parser.add_argument("--run-name", help="name of this run's folder")
    parser.add_argument("--resume", action="store_true", help="continue --run-name from its latest checkpoint")
    parser.add_argument("--replay", metavar="TRAJECTORIES", help="train on a recorded stream; no actors, no envhub")
    args, rest = parser.parse_known_args(argv)
    if args.resume and not args.run_name:
        parser.error("--resume needs --run-name: the run folder to continue")
    overrides = list(rest)
    if args.resume:
        overrides += ["--run.resume", "true"]
    if args.replay:
        overrides += ["--run.replay", str(Path(args.replay).resolve())]
    for flag, key in FLAG_TO_KEY.items():
        if getattr(args, flag) is not None:
            overrides += [f"--{key}", str(getattr(args, flag))]
    try:
        return load_config(args.config, overrides), args
    except ConfigError as exc:
        parser.error(str(exc))


def make_run_dir(cfg: Config) -> Path:
    name = cfg.run.run_name or time.strftime("run-%Y%m%d-%H%M%S")
    run_dir = Path(cfg.run.output_dir).expanduser().resolve() / name
    if cfg.run.resume and not run_dir.is_dir():
        sys.exit(f"launch: --resume: no run folder {run_dir}")
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    write_resolved(cfg, run_dir / ("config.resumed.yaml" if cfg.run.resume else "config.yaml"))
    return run_dir


def main(argv: list[str]) -> int:
    cfg, _ = parse_args(argv)
    run_dir = make_run_dir(cfg)
    print(f"run folder: {run_dir}\ntensorboard: tensorboard --logdir {run_dir / 'tb'}", flush=True)
    from common.supervisor import Supervisor  # imports Ray: keep --help fast

    with Supervisor(cfg, run_dir, ROLE_ENV) as supervisor:
        return supervisor.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
