"""Two hosts: the learner on one machine, the actors and envhub on another, joined by ``ray start``.

The hosts are two network namespaces of this machine joined by a veth pair, so every byte between
them crosses a real network interface: the ZeroMQ channels (leases, trajectories, control), the
weight group's TCPStore and gloo traffic, and the actors' HTTP calls to envhub. Both ends of the
pair are named ``lh0`` inside their namespace, so one ``GLOO_SOCKET_IFNAME=lh0`` serves both hosts,
as one interface name serves a real cluster's nodes. The addresses exist only inside the two
namespaces; nothing is sent anywhere else.

    sudo .venv/bin/python -m pytest tests/test_two_hosts.py -q     # root: it makes namespaces

1. Make namespaces A and B, the veth pair between them, and bring ``lo`` and ``lh0`` up in each.
2. ``ray start --head`` in A with one CPU (room for the learner alone), ``ray start --address`` in
   B with three (two actors and an envhub server), every node with the shared token and
   ``GLOO_SOCKET_IFNAME`` in its environment as the README's cluster recipe says.
3. ``launch.py --ray-address`` from A; SIGKILL actor-0 (on B) after two learner steps.
4. The run finishes, the actor was restarted and rejoined the weight group, nothing was lost.
5. Stop Ray, kill by PID whatever is left in the namespaces, delete them (the veth pair goes with them).
"""

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.launching import REPO

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

RAY = str(REPO / ".venv" / "bin" / "ray")
IFNAME = "lh0"
PORT = 6379  # each namespace has its own port space: no clash with any other Ray on this machine
MAX_STEPS = 20
GROUPS_PER_STEP = 2  # configs/smoke.yaml


@dataclass
class TwoHosts:
    netns: tuple[str, str]
    ips: tuple[str, str]
    env: dict[str, str]

    @property
    def ray_address(self) -> str:
        return f"{self.ips[0]}:{PORT}"

    def exec_in(self, host: int, *argv: str) -> list[str]:
        """``argv`` run inside host ``host``'s (0: A, 1: B) network namespace."""
        return ["ip", "netns", "exec", self.netns[host], *argv]

    def host_of(self, pid: int) -> str:
        """"A" or "B": the namespace the process ``pid`` runs in."""
        return "AB"[self.netns.index(_ip("netns", "identify", str(pid)).strip())]


def _ip(*args: str) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def _skip_unless_namespaces_can_be_made() -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("two-host test: network namespaces are Linux only")
    if os.geteuid() != 0:
        pytest.skip("two-host test: making network namespaces needs root")
    if shutil.which("ip") is None:
        pytest.skip("two-host test: the `ip` command (iproute2) is missing")


def _make_hosts(netns: tuple[str, str], ips: tuple[str, str]) -> None:
    for name in netns:
        try:
            _ip("netns", "add", name)
        except RuntimeError as exc:  # a container without CAP_SYS_ADMIN, a kernel without netns
            pytest.skip(f"two-host test: cannot make a network namespace ({exc})")
    # The pair is made inside A with its peer straight in B: it never appears in this machine's own namespace.
    _ip("netns", "exec", netns[0], "ip", "link", "add", IFNAME, "type", "veth", "peer", "name", IFNAME,
        "netns", netns[1])
    for name, ip in zip(netns, ips):
        _ip("netns", "exec", name, "ip", "addr", "add", f"{ip}/24", "dev", IFNAME)
        _ip("netns", "exec", name, "ip", "link", "set", IFNAME, "up")
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")  # Ray and the roles use loopback too


def _start_node(hosts: TwoHosts, host: int, argv: list[str], log_path: Path,
                timeout_s: float = 90.0) -> subprocess.Popen:
    """``ray start ... --block`` in host ``host``; returns once the node is up."""
    with log_path.open("w") as log:  # a file, not a pipe: a pipe nobody reads would block Ray once full
        node = subprocess.Popen(hosts.exec_in(host, *argv), env=hosts.env, stdout=log, stderr=subprocess.STDOUT,
                                cwd=REPO)
    deadline = time.monotonic() + timeout_s
    while "Ray runtime started" not in log_path.read_text(errors="replace"):
        if node.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"ray start on host {'AB'[host]} did not come up:\n"
                                 + log_path.read_text(errors="replace")[-3000:])
        time.sleep(0.2)
    return node


def _tear_down(nodes: list[subprocess.Popen], netns: tuple[str, str]) -> None:
    """Stop the nodes, then kill by PID every process still in the namespaces (all of them ours:
    nothing else runs there), then delete the namespaces, which deletes the veth pair with them."""
    for node in reversed(nodes):  # workers first, then the head
        node.send_signal(signal.SIGTERM)  # --block: `ray start` stops the processes it started
    for node in nodes:
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            node.kill()
    existing = set(_ip("netns", "list").split())
    for name in netns:
        if name not in existing:
            continue
        for _ in range(50):
            pids = [int(p) for p in _ip("netns", "pids", name).split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        _ip("netns", "del", name)


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[TwoHosts]:
    """Host A runs the Ray head with one CPU, host B a Ray worker node with three."""
    _skip_unless_namespaces_can_be_made()
    tag = os.getpid()
    netns = (f"lh-a-{tag}", f"lh-b-{tag}")
    subnet = f"10.231.{tag % 250 + 1}"
    hosts = TwoHosts(netns, (f"{subnet}.1", f"{subnet}.2"), {
        # Nothing to proxy between the hosts. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (conftest's, for
        # one-machine Ray) turns multi-node clusters off even on Linux: `ray start --address` refuses to join.
        **{k: v for k, v in os.environ.items()
           if "proxy" not in k.lower() and k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"},
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",
        "GLOO_SOCKET_IFNAME": IFNAME,  # both hosts' end of the pair: the collectives cross it
        "LONGHORIZON_TOKEN": secrets.token_hex(24),  # the learner and envhub bind beyond loopback
        "CUDA_VISIBLE_DEVICES": "",
    })
    # Short: Ray's Unix socket paths live under it and must stay within 107 characters. Its own, not
    # /tmp/ray, so this cluster's session files never mix with another Ray's on this machine.
    ray_tmp = tempfile.mkdtemp(prefix="lh-ray-")
    nodes: list[subprocess.Popen] = []
    try:
        _make_hosts(netns, hosts.ips)
        common = ["--block", "--disable-usage-stats", "--num-gpus", "0"]
        nodes.append(_start_node(hosts, 0, [
            RAY, "start", "--head", *common, "--node-ip-address", hosts.ips[0], "--port", str(PORT),
            "--num-cpus", "1", "--include-dashboard", "false", "--temp-dir", ray_tmp], tmp_path / "ray-head.log"))
        nodes.append(_start_node(hosts, 1, [
            RAY, "start", *common, "--address", hosts.ray_address, "--node-ip-address", hosts.ips[1],
            "--num-cpus", "3"], tmp_path / "ray-worker.log"))
        yield hosts
    finally:
        _tear_down(nodes, netns)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_a_run_across_two_hosts_trains_and_survives_losing_an_actor(two_hosts, tmp_path):
    hosts = two_hosts
    a_ip, b_ip = hosts.ips
    proc = subprocess.Popen(
        hosts.exec_in(0, sys.executable, "launch.py", "--config", "configs/smoke.yaml",
                      "--ray-address", hosts.ray_address, "--output-dir", str(tmp_path), "--run-name", "two",
                      "--max-steps", str(MAX_STEPS)),
        cwd=REPO, env=hosts.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("step ") and int(line.split()[1].split("/")[0]) >= 2:
                break
        else:
            raise AssertionError("the run ended before its second step:\n" + "".join(lines)[-5000:])
        # Where each role really runs (the pids are this machine's: only the network is split).
        pids = {role: int((tmp_path / "two" / "logs" / f"{role}.pid").read_text())
                for role in ("learner-0", "actor-0", "actor-1", "envhub-0")}
        hosts_of_roles = {role: hosts.host_of(pid) for role, pid in pids.items()}
        os.kill(pids["actor-0"], signal.SIGKILL)
        out = "".join(lines) + proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-5000:]

    # The plan the launcher printed: the learner alone on A, the actors and envhub on B.
    assert re.search(rf"^\s+\d+ \({re.escape(a_ip)}\)\s+0/0\s+1/1\s+learner-0$", out, re.M), out[:3000]
    assert re.search(rf"^\s+\d+ \({re.escape(b_ip)}\)\s+0/0\s+3/3\s+actor-0\.\.1, envhub-0$", out, re.M), out[:3000]
    assert hosts_of_roles == {"learner-0": "A", "actor-0": "B", "actor-1": "B", "envhub-0": "B"}, hosts_of_roles
    assert f"envhub servers: http://{b_ip}:" in out, out[:3000]  # bound on B's address, not loopback
    assert "actor-0 restarted in" in out, out[-5000:]

    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["step"] == MAX_STEPS and summary["actor_restarts"]["count"] == 1
    ledger = summary["ledger"]
    assert ledger["ledger_broken"] == "", ledger["ledger_broken"]
    assert ledger["consumed"] == MAX_STEPS * GROUPS_PER_STEP  # every trained group counted once
    # The restarted actor, on B, rejoined the weight group hosted on A and got the latest weights.
    restarted = next((a for a in summary["actors"] if a["actor_id"] == 0), None)
    assert restarted is not None, f"the restarted actor-0 never reported back: {summary['actors']}"
    assert restarted["versions_received"], "the restarted actor never rejoined the weight group across hosts"
    assert restarted["weight_version"] >= MAX_STEPS - 1, restarted

