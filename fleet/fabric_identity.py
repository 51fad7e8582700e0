"""Which NVLink fabric a node's GPUs report, which fabric its rack should have,
and the nodes where the two disagree (issue #31, "the rack as a failure domain").

An agent reports, per GPU, the fabric manager's cluster UUID (one per NVLink
domain: an NVL72 rack) and clique id (the fabric partition within it). A node
recorded in a rack whose fabric is another is miswired, or recorded in the wrong
rack; a node whose GPUs report different fabrics is misconfigured. Either way a
gang placed "in one rack" there would not share one NVLink fabric.

Plain data in, plain data out: no Django. ``fleet.services.read.fabric`` reads
the rows, the attention view, the node's signals and ``import_topology --from
agents`` use the answers.
"""

from __future__ import annotations

import functools
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fleet.topology.model import natural_key

# Why a node is flagged.
OTHER_DOMAIN = "other_domain"  # its GPUs report another cluster UUID than its rack's
OTHER_CLIQUE = "other_clique"  # the rack's cluster UUID, another clique (a partition apart)
GPUS_DISAGREE = "gpus_disagree"  # its own GPUs report different fabrics
KINDS = (OTHER_DOMAIN, OTHER_CLIQUE, GPUS_DISAGREE)

# Where a rack's fabric comes from.
FROM_EXTERNAL_ID = "external_id"  # <ClusterUUID>.<CliqueId> or <ClusterUUID>, as imported
FROM_MAJORITY = "majority"  # what most of its reporting nodes say


@dataclass(frozen=True, order=True)
class Fabric:
    """One GPU's NVLink fabric: the cluster UUID (lower case) and the clique id."""

    cluster_uuid: str
    clique_id: int | None

    def __str__(self) -> str:
        return self.cluster_uuid if self.clique_id is None else f"{self.cluster_uuid}.{self.clique_id}"


@functools.lru_cache(maxsize=4096)  # a fleet has a few fabrics, read once a node per view
def fabric_of(cluster_uuid: object, clique_id: object) -> Fabric | None:
    """A reported fabric, or None where the GPU is in no cluster yet (NVML gives a
    UUID of zeros, which the agent sends as null, until the fabric manager has
    put the GPU in one)."""
    if not isinstance(cluster_uuid, str) or not cluster_uuid.strip():
        return None
    clique: int | None = None
    if isinstance(clique_id, int) and not isinstance(clique_id, bool):
        clique = clique_id
    elif isinstance(clique_id, str) and clique_id.strip().lstrip("-").isdigit() and len(clique_id) < 20:
        clique = int(clique_id)
    return Fabric(cluster_uuid.strip().lower(), clique)


def parse_external_id(external_id: str) -> tuple[str | None, int | None]:
    """The fabric a rack's external id names: ``(uuid, clique)`` for
    ``<ClusterUUID>.<CliqueId>`` (the ``nvidia.com/gpu.clique`` label's form),
    ``(uuid, None)`` for a bare ClusterUUID (what a Kubernetes clique import
    keys racks by), ``(None, None)`` for anything else (a Slurm block name, a
    provider's rack label, nothing)."""
    text = (external_id or "").strip()
    head, dot, tail = text.rpartition(".")
    if dot and tail.isdigit() and len(tail) < 20 and _is_uuid(head):
        return head.lower(), int(tail)
    if _is_uuid(text):
        return text.lower(), None
    return None, None


def _is_uuid(text: str) -> bool:
    # 36 characters with dashes, as NVML's UUID is printed by the agent and GPU
    # Feature Discovery; uuid.UUID alone would also take 32 bare hex digits.
    if len(text) != 36:
        return False
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class RackInfo:
    rack_id: int
    name: str
    external_id: str = ""


@dataclass(frozen=True)
class NodeReport:
    """A node and the distinct fabrics its GPUs reported lately (empty: none did,
    or only long ago; the caller leaves stale readings out)."""

    node_id: int
    hostname: str
    rack_id: int
    fabrics: frozenset[Fabric] = frozenset()

    @functools.cached_property
    def fabric(self) -> Fabric | None:
        """The node's fabric when its GPUs agree on one."""
        return next(iter(self.fabrics)) if len(self.fabrics) == 1 else None


@dataclass(frozen=True)
class RackFabric:
    """The fabric a rack should have: ``cluster_uuid`` and ``clique_id`` as far as
    they are known (None: not known, and nothing is judged against it),
    ``source`` where they come from, ``note`` why one is unknown."""

    cluster_uuid: str | None = None
    clique_id: int | None = None
    source: str = ""
    note: str = ""

    def matches(self, fabric: Fabric) -> bool:
        return fabric.cluster_uuid == self.cluster_uuid and self.clique_id in (None, fabric.clique_id)

    def as_dict(self) -> dict[str, object]:
        return {
            "cluster_uuid": self.cluster_uuid,
            "clique_id": self.clique_id,
            "source": self.source,
            "note": self.note,
        }


@dataclass(frozen=True)
class Mismatch:
    """A node whose fabric disagrees with its rack's (``kind``), the rack it is
    recorded in and, where one is, the rack its fabric says (``fabric_rack``)."""

    node_id: int
    hostname: str
    kind: str
    rack_id: int
    rack: str
    reported: tuple[Fabric, ...]
    expected: RackFabric
    fabric_rack_id: int | None = None
    fabric_rack: str = ""

    @property
    def text(self) -> str:
        seen = ", ".join(str(f) for f in self.reported)
        if self.kind == GPUS_DISAGREE:
            return f"{self.hostname}: its GPUs report different NVLink fabrics ({seen})"
        where = f" (the fabric of rack {self.fabric_rack})" if self.fabric_rack else " (no rack has it)"
        if self.kind == OTHER_CLIQUE:
            return (
                f"{self.hostname}: recorded in {self.rack}, whose nodes are in clique "
                f"{self.expected.clique_id}, but its GPUs report clique {self.reported[0].clique_id}"
                f"{where}: a fabric partition apart"
            )
        return (
            f"{self.hostname}: recorded in {self.rack} (fabric {self.expected.cluster_uuid}), "
            f"but its GPUs report fabric {seen}{where}"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "node_id": self.node_id,
            "hostname": self.hostname,
            "kind": self.kind,
            "rack_id": self.rack_id,
            "rack": self.rack,
            "reported": [str(f) for f in self.reported],
            "expected": self.expected.as_dict(),
            "fabric_rack_id": self.fabric_rack_id,
            "fabric_rack": self.fabric_rack,
            "text": self.text,
        }


def _strict_majority(counts: Counter) -> tuple[object | None, str]:
    """The value more than half of the votes name, or None and why not."""
    total = sum(counts.values())
    if not total:
        return None, "no node reports a fabric"
    (top, n), *rest = counts.most_common()
    if 2 * n > total:
        return top, ""
    if rest and rest[0][1] == n:
        return None, f"a tie: {n} of {total} reporting nodes each"
    return None, f"no majority: at most {n} of {total} reporting nodes agree"


def fabric_counts(nodes: Iterable[NodeReport]) -> dict[int, Counter[Fabric]]:
    """By rack: how many of its nodes report each fabric, counting the nodes
    whose GPUs agree on one (what a rack's majority is taken over)."""
    counts: dict[int, Counter[Fabric]] = defaultdict(Counter)
    for node in nodes:
        if node.fabric is not None:
            counts[node.rack_id][node.fabric] += 1
    return counts


def rack_fabric(rack: RackInfo, counts: Mapping[Fabric, int]) -> RackFabric:
    """The fabric ``rack`` should have, steps:

    1. Its external id, where it names a fabric (``<uuid>.<clique>``, or a bare
       ``<uuid>``): an import recorded it, and one node that disagrees with it
       is flagged.
    2. Otherwise (or for the clique, when the id names only the cluster UUID) the
       strict majority of the nodes whose GPUs agree on a fabric (``counts``, by
       fabric: :func:`fabric_counts`): more than half of them. A node alone is
       its own majority, so it is never "in disagreement"; a tie (9 and 9) or
       no majority leaves it unknown (said in ``note``) and nothing is flagged
       against it.
    3. The clique is the majority among the nodes of the chosen cluster UUID, so
       a node of another rack's fabric does not split the vote on partitions."""
    cluster, clique = parse_external_id(rack.external_id)
    if cluster is not None and clique is not None:
        return RackFabric(cluster, clique, FROM_EXTERNAL_ID)
    source = FROM_EXTERNAL_ID
    if cluster is None:
        source = FROM_MAJORITY
        clusters: Counter[str] = Counter()
        for fabric, n in counts.items():
            clusters[fabric.cluster_uuid] += n
        top, why = _strict_majority(clusters)
        if top is None:
            return RackFabric(note=why)
        cluster = str(top)
    cliques: Counter[int | None] = Counter()
    for fabric, n in counts.items():
        if fabric.cluster_uuid == cluster:
            cliques[fabric.clique_id] += n
    top_clique, why = _strict_majority(cliques)
    note = f"clique unknown: {why}" if cliques and top_clique is None else ""
    return RackFabric(cluster, top_clique if isinstance(top_clique, int) else None, source, note)


def expected_fabrics(
    racks: Iterable[RackInfo], counts: Mapping[int, Mapping[Fabric, int]]
) -> dict[int, RackFabric]:
    """Every rack's fabric (:func:`rack_fabric`), not only those with reporting
    nodes: a rack recorded with its fabric is where a node of that fabric
    belongs, reported or not."""
    return {r.rack_id: rack_fabric(r, counts.get(r.rack_id, {})) for r in racks}


def racks_to_judge(
    expected: Mapping[int, RackFabric], counts: Mapping[int, Mapping[Fabric, int]]
) -> set[int]:
    """The racks where some node's fabric differs from the rack's: only their
    nodes need reading one by one (a fleet-wide view reads counts first)."""
    return {
        rack_id
        for rack_id, fabrics in counts.items()
        if rack_id in expected
        and expected[rack_id].cluster_uuid is not None
        and any(not expected[rack_id].matches(f) for f in fabrics)
    }


def mismatches(
    racks: Iterable[RackInfo],
    nodes: Iterable[NodeReport],
    expected: Mapping[int, RackFabric] | None = None,
) -> list[Mismatch]:
    """The nodes whose fabric disagrees with their rack's (:func:`rack_fabric`),
    sorted by rack name and hostname:

    * ``gpus_disagree``: the node's GPUs report different fabrics;
    * ``other_domain``: another cluster UUID than the rack's (miswired, or
      recorded in the wrong rack);
    * ``other_clique``: the rack's cluster UUID but another clique than most of
      its nodes (a fabric partition apart: it cannot reach them over NVLink).

    ``fabric_rack`` names the rack whose fabric the node reports, where exactly
    one other rack has it (that clique, else that cluster UUID).
    Nodes that reported nothing are never flagged. ``expected`` is every rack's
    fabric when the caller has it from the whole fleet's counts (then ``nodes``
    may be those of some racks only); by default it is taken from ``nodes``."""
    racks = {r.rack_id: r for r in racks}
    by_rack: dict[int, list[NodeReport]] = defaultdict(list)
    for node in nodes:
        if node.rack_id in racks:
            by_rack[node.rack_id].append(node)
    if expected is None:
        expected = expected_fabrics(racks.values(), fabric_counts(n for ns in by_rack.values() for n in ns))
    by_pair: dict[tuple[str, int | None], list[int]] = defaultdict(list)
    by_cluster: dict[str, list[int]] = defaultdict(list)
    for rack_id, fabric in expected.items():
        if fabric.cluster_uuid is not None:
            by_pair[(fabric.cluster_uuid, fabric.clique_id)].append(rack_id)
            by_cluster[fabric.cluster_uuid].append(rack_id)
    found: list[Mismatch] = []
    for rack_id, members in by_rack.items():
        rack, want = racks[rack_id], expected.get(rack_id, RackFabric())
        for node in members:
            reported = tuple(sorted(node.fabrics))
            fabric = node.fabric
            if len(reported) > 1:
                kind = GPUS_DISAGREE
            elif fabric is None or want.cluster_uuid is None or want.matches(fabric):
                continue
            elif fabric.cluster_uuid != want.cluster_uuid:
                kind = OTHER_DOMAIN
            else:
                kind = OTHER_CLIQUE
            other: int | None = None
            if fabric is not None:
                # The rack of this very clique, else the one rack of this cluster UUID.
                candidates = [
                    r for r in by_pair.get((fabric.cluster_uuid, fabric.clique_id), []) if r != rack_id
                ]
                candidates = candidates or [
                    r for r in by_cluster.get(fabric.cluster_uuid, []) if r != rack_id
                ]
                other = candidates[0] if len(candidates) == 1 else None
            found.append(
                Mismatch(
                    node_id=node.node_id,
                    hostname=node.hostname,
                    kind=kind,
                    rack_id=rack_id,
                    rack=rack.name,
                    reported=reported,
                    expected=want,
                    fabric_rack_id=other,
                    fabric_rack=racks[other].name if other is not None else "",
                )
            )
    return sorted(found, key=lambda m: (natural_key(m.rack), natural_key(m.hostname)))
