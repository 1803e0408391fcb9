"""Placement: the plan puts learner ranks on one node and one GPU under each actor engine, maps the
same flags to CPU processes where there is no GPU, refuses what cannot fit with a clear reason,
``--dry-run`` prints it and starts nothing, and a run joins a cluster started with ``ray start``."""

import os
import signal
import subprocess
import sys
from collections import Counter

import pytest

from common.config import load_config
from common.net import free_port
from launcher.placement import PlacementError, local_cluster, parse_cluster, plan_placement
from tests.launching import REPO

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)


def plan_for(cluster: str, *overrides: str):
    return plan_placement(parse_cluster(cluster), load_config(None, list(overrides)))


def groups_of(plan) -> dict:
    return {g.name: g for g in plan.groups}


def test_64_actors_and_8_learner_gpus_on_nine_8_gpu_nodes():
    plan = plan_for("9x8gpu,64cpu", "--actors.count", "64", "--learner.num_ranks", "8")
    groups = groups_of(plan)
    learner, actors, envhub = groups["learner"], groups["actors"], groups["envhub"]
    assert plan.on_gpus and learner.strategy == "STRICT_PACK"
    assert [b.gpus for b in learner.bundles] == [1] * 8
    learner_nodes = {b.node for b in learner.bundles}
    assert len(learner_nodes) == 1, "the learner ranks share one node"
    assert len(actors.bundles) == 64 and all(b.gpus == 1 for b in actors.bundles)
    per_node = Counter(b.node for b in actors.bundles)
    assert not learner_nodes & set(per_node) and sorted(per_node.values()) == [8] * 8
    assert len(envhub.bundles) == 8 and all(b.gpus == 0 and b.cpus > 0 for b in envhub.bundles)
    assert plan.envhub_of_actor == tuple(k % 8 for k in range(64))  # round-robin
    for node, spec in enumerate(plan.cluster.nodes):  # nothing oversubscribed
        here = [b for g in plan.groups for b in g.bundles if b.node == node]
        assert sum(b.gpus for b in here) <= spec.gpus and sum(b.cpus for b in here) <= spec.cpus


def test_servers_scale_with_the_actors():
    plan = plan_for("2x64cpu", "--actors.count", "10", "--envhub.actors_per_server", "4")
    assert len(groups_of(plan)["envhub"].bundles) == 3
    assert Counter(plan.envhub_of_actor) == {0: 4, 1: 3, 2: 3}


def test_without_gpus_the_same_flags_map_to_cpu_processes():
    plan = plan_for("2x16cpu", "--actors.count", "8", "--learner.num_ranks", "2", "--actors.torch_threads", "2")
    groups = groups_of(plan)
    assert not plan.on_gpus
    assert all(b.gpus == 0 for g in plan.groups for b in g.bundles)
    assert "GPU" not in groups["actors"].bundles[0].resources()
    assert groups["actors"].bundles[0].resources() == {"CPU": 2.0}
    assert len({b.node for b in groups["learner"].bundles}) == 1
    assert "CPU mode" in plan.format()


def test_nine_learner_gpus_on_8_gpu_nodes_is_a_clear_error():
    with pytest.raises(PlacementError, match=r"learner.*STRICT_PACK.*9 GPU.*8 GPU"):
        plan_for("9x8gpu,64cpu", "--actors.count", "8", "--learner.num_ranks", "9")


def test_more_actors_than_gpus_left_is_a_clear_error():
    with pytest.raises(PlacementError, match=r"cannot place actors.*64 GPU.*56 GPU"):
        plan_for("8x8gpu,64cpu", "--actors.count", "64", "--learner.num_ranks", "8")


def test_cluster_grammar():
    cluster = parse_cluster("1x32cpu+8x8gpu,96cpu")
    assert len(cluster.nodes) == 9 and cluster.gpus == 64 and cluster.cpus == 32 + 8 * 96
    for bad in ("", "8x", "9x8gpu,64", "2x8gpu", "0x8cpu", "8xgpu"):
        with pytest.raises(PlacementError):
            parse_cluster(bad)


def test_a_small_machine_runs_the_smoke_config_oversubscribed():
    cfg = load_config(REPO / "configs" / "smoke.yaml")
    plan = plan_placement(local_cluster(cfg, cpu_count=2, gpu_count=0), cfg)
    assert sum(len(g.bundles) for g in plan.groups) == 1 + 2 + 1


def dry_run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # In-process check that nothing imported Ray: a --cluster dry run must not even load it.
    code = ("import sys, launch; rc = launch.main(sys.argv[1:]); "
            "assert 'ray' not in sys.modules or '--ray-address' in sys.argv, 'imported ray'; sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=env)


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path):
    proc = dry_run("--actors", "64", "--learner-gpus", "8", "--dry-run", "--cluster", "9x8gpu,64cpu",
                   "--output-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "STRICT_PACK" in proc.stdout and "learner-0..7" in proc.stdout and "actor-56..63" in proc.stdout
    assert not any(tmp_path.iterdir()), "a dry run makes no run folder"


def test_dry_run_of_an_unplaceable_request_says_why(tmp_path):
    proc = dry_run("--actors", "8", "--learner-gpus", "9", "--dry-run", "--cluster", "9x8gpu,64cpu",
                   "--output-dir", str(tmp_path))
    assert proc.returncode == 2 and "STRICT_PACK" in proc.stderr, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def ray_head():
    """A one-node cluster started the way an operator starts a head node (``ray start --head``)."""
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    head = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "ray"), "start", "--head", "--block", "--port", str(port),
         "--node-ip-address", "127.0.0.1", "--num-cpus", "4", "--include-dashboard", "false",
         "--disable-usage-stats"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in head.stdout:
        if "Ray runtime started" in line:
            break
    yield f"127.0.0.1:{port}", env
    head.send_signal(signal.SIGTERM)  # --block: the head stops the processes it started
    head.communicate(timeout=60)


def test_a_cluster_started_with_ray_start_is_planned_from_its_own_nodes(ray_head):
    address, env = ray_head
    fits = dry_run("--config", "configs/smoke.yaml", "--dry-run", "--ray-address", address, env=env)
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert "0 (127.0.0.1)" in fits.stdout and "4/4" in fits.stdout  # the head's 4 CPUs, all used
    refused = dry_run("--config", "configs/smoke.yaml", "--actors", "4", "--dry-run", "--ray-address", address,
                      env=env)
    assert refused.returncode == 2 and "cannot place actors" in refused.stderr, refused.stdout + refused.stderr


@pytest.mark.slow
def test_a_run_joins_a_cluster_started_with_ray_start(ray_head, tmp_path):
    address, env = ray_head
    proc = subprocess.run([sys.executable, "launch.py", "--config", "configs/smoke.yaml", "--ray-address", address,
                           "--output-dir", str(tmp_path), "--run-name", "joined"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "learner-0, actor-0..1, envhub-0" in proc.stdout
    assert (tmp_path / "joined" / "summary.json").exists()
