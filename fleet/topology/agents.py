"""Read the fleet from the NVLink fabric its node agents report
(``import_topology --from agents``): racks are built from the fabric itself.

* Rack: one per ClusterUUID the GPUs report, the NVLink domain, as the
  Kubernetes import keys clique racks (the CliqueId is a fabric-manager
  partition of that one domain, so it does not split the rack, and both sources
  agree on the same racks). Where a rack is recorded per clique
  (``<ClusterUUID>.<CliqueId>``), nodes of that clique go to it.
* A domain no rack is recorded for yet takes over the rack that holds most of
  its nodes (more than half), when that rack names no fabric of its own (made by
  hand, or a Slurm block: it keeps its external id, so the other source still
  matches it); else it is a new rack, named after what its hostnames share.
* GPUs: the node's GPUs as recorded. An agent reports only GPUs the node has, so
  its readings cannot add one; a GPU that was silent is not removed.
* States: not read (``None``: kept); heartbeats already drive them.
* Nodes that reported no fabric, only long ago (stale), or whose GPUs disagree
  on it are left as they are (the topology is ``partial``), never removed or
  retired because they did not report, and the notes say how many.

Plain data in (what :mod:`fleet.services.read.fabric` gathers), a Topology out.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from fleet.fabric_identity import Fabric, parse_external_id
from fleet.topology.model import (
    DesiredDomain,
    DesiredNode,
    Topology,
    check_domains,
    name_after_hostnames,
    natural_key,
)

SOURCE = "agents"
# Hosts a note names before "and N more".
NOTE_HOSTS = 10


@dataclass(frozen=True)
class AgentNode:
    """A node as recorded and what its agent reported: ``fabrics`` are the
    distinct fabrics its GPUs reported within the age bound; ``stale`` is True
    when it reported one only before that."""

    hostname: str
    gpus: int
    rack: str
    fabrics: frozenset[Fabric] = frozenset()
    stale: bool = False


@dataclass(frozen=True)
class RecordedRack:
    name: str
    external_id: str = ""


def _hosts(hosts: list[str]) -> str:
    more = f" and {len(hosts) - NOTE_HOSTS} more" if len(hosts) > NOTE_HOSTS else ""
    return ", ".join(hosts[:NOTE_HOSTS]) + more


def read_agents(nodes: Iterable[AgentNode], racks: Iterable[RecordedRack], *, max_age_s: float) -> Topology:
    """The Topology the agents' fabric reports describe (see the module
    docstring), steps:

    1. Sort the nodes: one fabric (used), none, stale, or GPUs that disagree.
    2. Key each used node by the rack recorded for its clique, else for its
       cluster UUID, else by the cluster UUID itself (a domain with no rack yet).
    3. Give each domain with no rack the one holding more than half of its
       nodes, if that rack names no fabric and no other domain took it.
    4. Name the rest after their hostnames, avoiding every recorded rack's name
       (a name match would make the import take over that rack)."""
    racks = list(racks)
    by_name = {r.name: r for r in racks}
    claimed: dict[tuple[str, int | None], RecordedRack] = {}
    for rack in racks:
        cluster, clique = parse_external_id(rack.external_id)
        if cluster is not None:
            claimed.setdefault((cluster, clique), rack)

    # 1. Sort the nodes.
    used: list[tuple[AgentNode, Fabric]] = []
    silent: list[str] = []
    stale: list[str] = []
    disagree: list[str] = []
    for node in sorted(nodes, key=lambda n: natural_key(n.hostname)):
        if len(node.fabrics) == 1:
            used.append((node, next(iter(node.fabrics))))
        elif len(node.fabrics) > 1:
            disagree.append(f"{node.hostname} ({', '.join(str(f) for f in sorted(node.fabrics))})")
        elif node.stale:
            stale.append(node.hostname)
        else:
            silent.append(node.hostname)

    # 2. Key by the recorded rack of the clique, else of the cluster, else the UUID.
    domains: dict[str, DesiredDomain] = {}
    new_keys: set[str] = set()  # domains no rack is recorded for
    current: dict[str, Counter] = defaultdict(Counter)
    for node, fabric in used:
        rack = claimed.get((fabric.cluster_uuid, fabric.clique_id)) or claimed.get(
            (fabric.cluster_uuid, None)
        )
        key = rack.external_id if rack is not None else fabric.cluster_uuid
        if key not in domains:
            domains[key] = DesiredDomain(name=rack.name if rack is not None else key, external_id=key)
            if rack is None:
                new_keys.add(key)
        domains[key].nodes.append(DesiredNode(hostname=node.hostname, gpus=node.gpus))
        current[key][node.rack] += 1

    # 3. A new domain takes over the rack holding most of its nodes, if that rack
    # names no fabric (it keeps a Slurm block name as its external id).
    taken = {domains[k].name for k in domains if k not in new_keys}
    unnamed: list[DesiredDomain] = []
    for key in sorted(new_keys, key=lambda k: (-len(domains[k].nodes), k)):
        domain = domains[key]
        (rack_name, n), *_ = current[key].most_common(1)
        rack = by_name.get(rack_name)
        if (
            rack is not None
            and 2 * n > len(domain.nodes)
            and rack.name not in taken
            and parse_external_id(rack.external_id)[0] is None
        ):
            taken.add(rack.name)
            domain.name = rack.name
            domain.external_id = rack.external_id or key
        else:
            unnamed.append(domain)

    # 4. Name the others after their hostnames.
    result = list(domains.values())
    check_domains(result, {})
    name_after_hostnames(unnamed, taken=set(by_name))

    notes = [
        f"{len(used)} nodes reported their NVLink fabric in the last {max_age_s:g} s; "
        "nodes that did not are left as they are"
    ]
    if silent:
        notes.append(f"left as they are, no fabric reported ({len(silent)}): {_hosts(silent)}")
    if stale:
        notes.append(
            f"left as they are, fabric reported more than {max_age_s:g} s ago, stale ({len(stale)}): "
            f"{_hosts(stale)}"
        )
    if disagree:
        notes.append(
            f"left as they are, their GPUs disagree on the fabric ({len(disagree)}): {_hosts(disagree)}"
        )
    return Topology(source=SOURCE, domains=result, partial=True, notes=notes)
