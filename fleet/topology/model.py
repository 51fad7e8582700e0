"""The source-neutral picture of a fleet that every importer produces.

Parsers (Kubernetes node lists, Slurm ``topology.conf``) are pure functions that
turn a file into a ``Topology``; the import service compares it with the
database. Nothing here imports Django."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Node states an importer may ask for. ``None`` on a node means "the source does
# not say" (a Slurm topology.conf without scontrol output): keep what we have.
HEALTHY = "healthy"
DRAINING = "draining"
FAILED = "failed"
STATES = (HEALTHY, DRAINING, FAILED)


class TopologyError(Exception):
    """A source that cannot be imported. ``place`` says where: ``file:line`` for
    text files, a JSON path such as ``items[3].status.capacity`` for JSON."""

    def __init__(self, message: str, place: str = "") -> None:
        self.message = message
        self.place = place
        super().__init__(f"{place}: {message}" if place else message)


@dataclass(frozen=True)
class DesiredNode:
    hostname: str
    gpus: int | None = None  # None: the source does not say (keep, or the default)
    state: str | None = None  # HEALTHY, DRAINING, FAILED, or None (keep)
    reason: str = ""


@dataclass
class DesiredDomain:
    """One NVLink domain as the source sees it: a rack (NVL72 clique, Slurm block)
    or a single HGX node."""

    name: str
    external_id: str
    nodes: list[DesiredNode] = field(default_factory=list)

    @property
    def gpus_per_node(self) -> int | None:
        counts = {n.gpus for n in self.nodes if n.gpus is not None}
        return counts.pop() if len(counts) == 1 else None


@dataclass
class Topology:
    """What the source says the fleet is. ``skipped`` lists hosts left out on
    purpose (no GPUs), with why, so the report can say so."""

    source: str
    domains: list[DesiredDomain] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def hostnames(self) -> list[str]:
        return [n.hostname for d in self.domains for n in d.nodes]


_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple:
    """Sort ``n2`` before ``n10``: digit runs compare as numbers."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in _DIGITS.split(text) if part
    )


def check_domains(domains: list[DesiredDomain], describe: dict[str, str]) -> None:
    """Rules every source must meet: a host in one domain only, and one GPU count
    per domain (the rack's ``gpus_per_node``). ``describe`` maps a hostname to the
    place it came from, for the error."""
    seen: dict[str, str] = {}
    for domain in domains:
        for node in domain.nodes:
            if node.hostname in seen:
                raise TopologyError(
                    f"host {node.hostname} is in both {seen[node.hostname]} and {domain.name}",
                    describe.get(node.hostname, ""),
                )
            seen[node.hostname] = domain.name
        counts: dict[int, str] = {}
        for node in domain.nodes:
            if node.gpus is None:
                continue
            counts.setdefault(node.gpus, node.hostname)
            if len(counts) > 1:
                first_gpus, first_host = next(iter(counts.items()))
                raise TopologyError(
                    f"host {node.hostname} has {node.gpus} GPUs but {first_host} in the same "
                    f"NVLink domain {domain.name} has {first_gpus}; a domain's nodes must agree",
                    describe.get(node.hostname, ""),
                )
        domain.nodes.sort(key=lambda n: natural_key(n.hostname))
