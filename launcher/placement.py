"""Where every process of a run goes: a pure plan from a cluster description and the config.

``plan_placement(cluster, cfg)`` touches neither Ray nor the machine. The launcher's
``--dry-run`` prints its result; a real launch turns the same plan into Ray placement groups
(``launcher/ray_cluster.py``). The plan has three groups, placed in this order:

1. ``learner``: one bundle per rank, ``STRICT_PACK`` (the ranks' collectives stay on one node).
2. ``actors``: one bundle per actor, ``PACK``; each holds one GPU for the actor's engine.
3. ``envhub``: ``ceil(actors / envhub.actors_per_server)`` CPU bundles, ``SPREAD``;
   actor k talks to server ``k % servers`` (round-robin).

Where the cluster has no GPU the same flags map to CPU processes: the bundles hold CPUs only.
Each bundle also holds the CPUs its process uses (``torch_threads``, ``envhub.cpus_per_server``).
A request that cannot fit raises ``PlacementError`` saying what is missing, before anything starts.

Cluster grammar (``--cluster``): node groups joined by ``+``, each ``[COUNTx]RES[,RES]`` where RES
is ``<n>gpu`` or ``<n>cpu``: ``9x8gpu,64cpu`` (nine nodes of 8 GPUs and 64 CPUs),
``1x32cpu+8x8gpu,96cpu``, ``2x16cpu``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from common.config import Config


class PlacementError(ValueError):
    """The run does not fit the cluster, or the cluster description does not parse."""


@dataclass(frozen=True)
class Node:
    """One machine of the cluster."""

    gpus: int
    cpus: float
    address: str = ""
    """Its IP on a live Ray cluster; empty in a described cluster."""
    node_id: str = ""
    """Its Ray node ID on a live cluster (the launcher pins each bundle to its plan node); empty otherwise."""


@dataclass(frozen=True)
class Cluster:
    nodes: tuple[Node, ...]

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)


@dataclass(frozen=True)
class Bundle:
    """The resources of one process and the node the plan expects it on."""

    role: str
    gpus: int
    cpus: float
    node: int

    def resources(self) -> dict[str, float]:
        """As a Ray bundle; Ray rejects zero-valued entries only when all are zero, keep it clean."""
        return {"CPU": float(self.cpus), **({"GPU": float(self.gpus)} if self.gpus else {})}


@dataclass(frozen=True)
class GroupPlan:
    """One Ray placement group."""

    name: str
    strategy: str
    bundles: tuple[Bundle, ...]


@dataclass(frozen=True)
class PlacementPlan:
    cluster: Cluster
    on_gpus: bool
    groups: tuple[GroupPlan, ...]
    envhub_of_actor: tuple[int, ...]
    """Index of the envhub server actor k talks to."""
    notes: tuple[str, ...] = ()

    def locate(self, role: str) -> tuple[GroupPlan, int]:
        """The group and bundle index of ``role`` (``actor-3``, ``learner-0``, ``envhub-1``)."""
        for group in self.groups:
            for index, bundle in enumerate(group.bundles):
                if bundle.role == role:
                    return group, index
        raise KeyError(f"no bundle for {role!r} in the placement plan")

    def format(self) -> str:
        return format_plan(self)


# --------------------------------------------------------------------------- cluster descriptions

_GROUP = re.compile(r"^(?:(\d+)x)?(.+)$")
_RESOURCE = re.compile(r"^(\d+(?:\.\d+)?)(gpu|cpu)s?$")


def parse_cluster(text: str) -> Cluster:
    """``"9x8gpu,64cpu"`` -> nine nodes of 8 GPUs and 64 CPUs (grammar in the module docstring)."""
    nodes: list[Node] = []
    for part in text.replace(" ", "").lower().split("+"):
        match = _GROUP.match(part)
        if not part or not match:
            raise PlacementError(f"--cluster {text!r}: {part!r} is not [COUNTx]RES[,RES] (e.g. 9x8gpu,64cpu)")
        count, found = int(match.group(1) or 1), {"gpu": 0.0, "cpu": 0.0}
        for resource in match.group(2).split(","):
            res = _RESOURCE.match(resource)
            if not res:
                raise PlacementError(f"--cluster {text!r}: {resource!r} is not <n>gpu or <n>cpu")
            found[res.group(2)] = float(res.group(1))
        if count < 1 or found["cpu"] <= 0 or found["gpu"] != int(found["gpu"]):
            raise PlacementError(f"--cluster {text!r}: {part!r} needs >= 1 node, > 0 CPUs, whole GPUs")
        nodes += [Node(int(found["gpu"]), found["cpu"])] * count
    return Cluster(tuple(nodes))


def local_cluster(cfg: Config, cpu_count: int, gpu_count: int) -> Cluster:
    """This machine as a fresh one-node Ray cluster. It claims at least the CPUs the run asks for:
    a small machine oversubscribes its cores (each role caps its torch threads) instead of refusing."""
    demand = sum(cpus for _, _, roles in _requests(cfg, gpu_count > 0) for _, _, cpus in roles)
    return Cluster((Node(gpu_count, float(max(cpu_count, demand)), "127.0.0.1"),))


# --------------------------------------------------------------------------- the plan


def plan_placement(cluster: Cluster, cfg: Config) -> PlacementPlan:
    """Bundles of every process, each on the node it is expected to land on (pure)."""
    if not cluster.nodes:
        raise PlacementError("the cluster has no nodes")
    on_gpus = cluster.gpus > 0
    free = [[node.gpus, node.cpus] for node in cluster.nodes]
    groups = tuple(GroupPlan(name, strategy, _place(name, strategy, roles, free, cluster))
                   for name, strategy, roles in _requests(cfg, on_gpus) if roles)
    servers = _envhub_servers(cfg)
    return PlacementPlan(cluster, on_gpus, groups, tuple(k % servers for k in range(_actor_count(cfg))),
                         _notes(cfg, on_gpus))


def _notes(cfg: Config, on_gpus: bool) -> tuple[str, ...]:
    """What fits but is probably not what the user meant."""
    notes, servers = [], _envhub_servers(cfg)
    if on_gpus and cfg.actors.engine == "cpu" and _actor_count(cfg):
        notes.append("actors.engine is cpu: each actor holds a GPU it does not use (--actors.engine vllm)")
    sessions = math.ceil(_actor_count(cfg) / servers) * cfg.actors.max_concurrent_episodes if servers else 0
    if sessions > cfg.envhub.max_sessions:
        notes.append(f"a server may be asked for {sessions} sessions, over envhub.max_sessions "
                     f"{cfg.envhub.max_sessions}: lower envhub.actors_per_server or raise max_sessions")
    return tuple(notes)


def _actor_count(cfg: Config) -> int:
    return 0 if cfg.run.replay else cfg.actors.count


def _envhub_servers(cfg: Config) -> int:
    actors = _actor_count(cfg)
    return math.ceil(actors / cfg.envhub.actors_per_server) if actors else 0


def _requests(cfg: Config, on_gpus: bool) -> list[tuple[str, str, list[tuple[str, int, float]]]]:
    """(group, strategy, [(role, gpus, cpus)]) for every group, in placement order."""
    gpu = 1 if on_gpus else 0
    return [
        ("learner", "STRICT_PACK",
         [(f"learner-{r}", gpu, float(cfg.learner.torch_threads)) for r in range(cfg.learner.num_ranks)]),
        ("actors", "PACK",
         [(f"actor-{k}", gpu, float(cfg.actors.torch_threads)) for k in range(_actor_count(cfg))]),
        ("envhub", "SPREAD",
         [(f"envhub-{s}", 0, float(cfg.envhub.cpus_per_server)) for s in range(_envhub_servers(cfg))]),
    ]


def _place(name: str, strategy: str, roles: list[tuple[str, int, float]], free: list[list[float]],
           cluster: Cluster) -> tuple[Bundle, ...]:
    """Simulate Ray's placement of one group on the ``free`` resources (updated in place)."""
    if strategy == "STRICT_PACK":
        node = _one_node_for(name, roles, free)
        nodes = [node] * len(roles)
    else:
        nodes, used, before = [], [0] * len(free), [list(f) for f in free]
        for role, gpus, cpus in roles:
            fits = [i for i, (g, c) in enumerate(free) if g >= gpus and c >= cpus - 1e-9]
            if not fits:
                raise PlacementError(_shortfall(name, roles, before, cluster, f"{role} does not fit"))
            # PACK fills nodes in order; SPREAD takes the node holding the fewest of this group.
            node = fits[0] if strategy == "PACK" else min(fits, key=lambda i: (used[i], i))
            used[node] += 1
            free[node][0] -= gpus
            free[node][1] -= cpus
            nodes.append(node)
    return tuple(Bundle(role, gpus, cpus, node) for (role, gpus, cpus), node in zip(roles, nodes))


def _one_node_for(name: str, roles: list[tuple[str, int, float]], free: list[list[float]]) -> int:
    """STRICT_PACK: the tightest node that holds the whole group (keeps big nodes for the rest)."""
    gpus, cpus = sum(r[1] for r in roles), sum(r[2] for r in roles)
    fits = [i for i, (g, c) in enumerate(free) if g >= gpus and c >= cpus - 1e-9]
    if not fits:
        roomiest = max(free, key=lambda f: (f[0], f[1]))
        raise PlacementError(
            f"cannot place {name}: its {len(roles)} bundles must share one node (STRICT_PACK) and need "
            f"{_res(gpus, cpus)} together; the roomiest node has {_res(*roomiest)} free")
    node = min(fits, key=lambda i: (free[i][0] - gpus, free[i][1] - cpus, i))
    free[node][0] -= gpus
    free[node][1] -= cpus
    return node


def _shortfall(name: str, roles: list[tuple[str, int, float]], free: list[list[float]],
               cluster: Cluster, what: str) -> str:
    """``free``: what the earlier groups left; the message says which resource runs short."""
    gpus, cpus = sum(r[1] for r in roles), sum(r[2] for r in roles)
    left = _res(sum(f[0] for f in free), sum(f[1] for f in free))
    return (f"cannot place {name}: {what}; its {len(roles)} bundles need {_res(gpus, cpus)}, and the "
            f"groups placed before it leave {left} of the cluster's {_res(cluster.gpus, cluster.cpus)}")


def _res(gpus: float, cpus: float) -> str:
    return f"{_num(gpus)} GPU, {_num(cpus)} CPU"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


# --------------------------------------------------------------------------- printing


def format_plan(plan: PlacementPlan) -> str:
    """The plan as the launcher prints it (``--dry-run`` and at the start of every run)."""
    c = plan.cluster
    lines = [f"placement plan: {len(c.nodes)} node(s), {_res(c.gpus, c.cpus)}; "
             f"{'GPU mode: one GPU per learner rank and per actor engine' if plan.on_gpus else 'CPU mode: no GPU'}",
             f"  {'group':<8} {'strategy':<12} bundles"]
    for g in plan.groups:
        resources = ", ".join(f"{k}: {_num(v)}" for k, v in sorted(g.bundles[0].resources().items(), reverse=True))
        lines.append(f"  {g.name:<8} {g.strategy:<12} {len(g.bundles)} x {{{resources}}}")
    width = max(4, *(len(_node_label(i, n)) for i, n in enumerate(c.nodes)))
    lines.append(f"  {'node':<{width}}  {'GPUs used':<10} {'CPUs used':<12} processes")
    for i, node in enumerate(c.nodes):
        here = [b for g in plan.groups for b in g.bundles if b.node == i]
        gpus = f"{_num(sum(b.gpus for b in here))}/{node.gpus}"
        cpus = f"{_num(sum(b.cpus for b in here))}/{_num(node.cpus)}"
        lines.append(f"  {_node_label(i, node):<{width}}  {gpus:<10} {cpus:<12} "
                     f"{compress_names([b.role for b in here]) or '-'}")
    servers = max(plan.envhub_of_actor, default=-1) + 1
    if servers:
        lines.append(f"  actor k -> envhub-(k % {servers}): {len(plan.envhub_of_actor)} actor(s) on "
                     f"{servers} envhub server(s)")
    lines += [f"  note: {note}" for note in plan.notes]
    return "\n".join(lines)


def _node_label(index: int, node: Node) -> str:
    return f"{index} ({node.address})" if node.address else str(index)


def compress_names(names: list[str]) -> str:
    """``[actor-0, actor-1, actor-2, envhub-1]`` -> ``actor-0..2, envhub-1``."""
    runs: list[list] = []  # [prefix, first, last]
    for name in names:
        prefix, _, number = name.rpartition("-")
        n = int(number)
        if runs and runs[-1][0] == prefix and runs[-1][2] == n - 1:
            runs[-1][2] = n
        else:
            runs.append([prefix, n, n])
    return ", ".join(f"{p}-{a}" if a == b else f"{p}-{a}..{b}" for p, a, b in runs)
