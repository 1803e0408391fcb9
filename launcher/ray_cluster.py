"""The Ray side of placement: start or join a cluster, describe it, and realise a plan.

``launcher/placement.py`` decides where every process goes without Ray; this module
connects to Ray (a fresh local cluster, or one started with ``ray start --head`` / ``ray start
--address``), reads the nodes the plan is computed for, creates one placement group per plan group
and hands each role the scheduling options of its bundle.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from launcher.placement import Cluster, GroupPlan, Node, PlacementError, PlacementPlan


def gpus_here() -> int:
    """GPUs this machine shows (``CUDA_VISIBLE_DEVICES`` first, so ``CUDA_VISIBLE_DEVICES=`` hides them)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")])
    return len([p for p in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)])


def start_local(cluster: Cluster, role_env: dict[str, str]) -> None:
    """A fresh one-node cluster on 127.0.0.1 with exactly the resources ``cluster`` describes."""
    node = cluster.nodes[0]
    # address="local": always a cluster of our own, never one a previous run left behind.
    ray.init(address="local", num_cpus=math.ceil(node.cpus), num_gpus=node.gpus, include_dashboard=False,
             log_to_driver=False, _node_ip_address="127.0.0.1", runtime_env={"env_vars": role_env},
             configure_logging=False)


def join(address: str, role_env: dict[str, str]) -> Cluster:
    """Connect to a running cluster (``auto`` or ``host:port`` of its head) and describe its nodes."""
    ray.init(address=address, log_to_driver=False, runtime_env={"env_vars": role_env}, configure_logging=False)
    return describe_running_cluster()


def describe_running_cluster() -> Cluster:
    """Alive nodes with their CPUs and GPUs, ordered by address (stable across calls)."""
    nodes = [Node(int(n["Resources"].get("GPU", 0)), float(n["Resources"].get("CPU", 0)), n["NodeManagerAddress"],
                  n["NodeID"]) for n in ray.nodes() if n.get("Alive")]
    return Cluster(tuple(sorted(nodes, key=lambda n: (n.address, -n.gpus))))


class PlacementGroups:
    """One Ray placement group per plan group, ready before any role starts.

    On a live cluster each bundle is pinned to the node the plan chose: Ray's own choice among the
    nodes that fit differs (it put a 1-CPU learner on the 3-CPU node of a 1 + 3 CPU cluster, and its
    envhub server on the 1-CPU node), so the printed plan would not be where the processes run, and
    a group the plan fits could find its node taken."""

    def __init__(self, plan: PlacementPlan, ready_timeout_s: float = 120.0):
        self.plan = plan
        self.groups = {g.name: placement_group([b.resources() for b in g.bundles], strategy=g.strategy,
                                               name=f"longhorizon-{g.name}", bundle_label_selector=_pins(plan, g))
                       for g in plan.groups}
        ready = {pg.ready(): name for name, pg in self.groups.items()}
        done, pending = ray.wait(list(ready), num_returns=len(ready), timeout=ready_timeout_s)
        if pending:
            self.remove()
            names = ", ".join(ready[ref] for ref in pending)
            raise PlacementError(
                f"placement group(s) {names} not placed after {ready_timeout_s:.0f} s although the plan fits "
                f"the cluster's listed resources: other jobs may hold them (see `ray status`)")

    def options(self, role: str) -> dict[str, Any]:
        """``.options(...)`` for the Ray actor of ``role``: its bundle's resources, in its bundle."""
        group, index = self.plan.locate(role)
        bundle = group.bundles[index]
        strategy = PlacementGroupSchedulingStrategy(self.groups[group.name], placement_group_bundle_index=index)
        return {"num_cpus": bundle.cpus, "num_gpus": bundle.gpus, "scheduling_strategy": strategy}

    def node_address(self, role: str) -> str:
        """IP of the node Ray put ``role``'s bundle on (services bind it on a multi-node cluster)."""
        group, index = self.plan.locate(role)
        node_id = placement_group_table(self.groups[group.name])["bundles_to_node_id"][index]
        return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)

    def remove(self) -> None:
        for pg in self.groups.values():
            remove_placement_group(pg)


def _pins(plan: PlacementPlan, group: GroupPlan) -> list[dict[str, str]] | None:
    """One label selector per bundle naming its plan node (Ray labels every node with its ID);
    None where the nodes have no IDs (a fresh local cluster of one node: nothing to choose)."""
    node_ids = [plan.cluster.nodes[b.node].node_id for b in group.bundles]
    return [{"ray.io/node-id": node_id} for node_id in node_ids] if all(node_ids) else None
