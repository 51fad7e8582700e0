"""The source-neutral picture of a fleet that every importer produces.

Parsers (Kubernetes node lists, Slurm ``topology.conf``) are pure functions that
turn a file into a ``Topology``; the import service compares it with the
database. Nothing here imports Django."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# Node states an importer may ask for. ``None`` on a node means "the source does
# not say" (a Slurm topology.conf without scontrol output): keep what we have.
HEALTHY = "healthy"
DRAINING = "draining"
FAILED = "failed"
STATES = (HEALTHY, DRAINING, FAILED)


# Limits of the columns an import writes (fleet.models: Node.hostname,
# Rack.name, Rack.external_id; tests/test_import_topology.py checks they agree),
# so a long name is refused with its place instead of failing in the database.
MAX_HOSTNAME = 200
MAX_RACK_NAME = 100
MAX_EXTERNAL_ID = 200
# GPUs one node may report (the import command passes the setting).
DEFAULT_MAX_GPUS = 8


def show(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: error messages stay one
    short line whatever the source holds."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    purpose (no GPUs), with why, so the report can say so. A ``partial`` source
    sees only some nodes (agents that reported): the nodes it does not list stay
    where they are instead of being removed or retired. ``notes`` are lines the
    report repeats (what the source left out, and why)."""

    source: str
    domains: list[DesiredDomain] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    partial: bool = False
    notes: list[str] = field(default_factory=list)

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


def name_after_hostnames(
    domains: list[DesiredDomain], taken: set[str] | frozenset[str] = frozenset()
) -> None:
    """Name each domain of two nodes or more after what its hostnames share
    (``gb200-r1`` for ``gb200-r1-n01..n18``). No shared part, or a name another
    domain or ``taken`` already has: the domain keeps its name (the UUID)."""
    taken = {d.name for d in domains} | set(taken)
    for domain in domains:
        if len(domain.nodes) < 2:
            continue
        words = [re.split(r"([-_.])", n.hostname) for n in domain.nodes]
        common: list[str] = []
        for parts in zip(*words, strict=False):
            if len(set(parts)) != 1:
                break
            common.append(parts[0])
        name = "".join(common).rstrip("-_.")
        if name and name not in taken:
            taken.add(name)
            domain.name = name


def check_name(value: object, what: str, limit: int, place: str) -> str:
    """``value`` as a name of at most ``limit`` characters, printable and without
    whitespace; else TopologyError at ``place``."""
    if not isinstance(value, str) or not value:
        raise TopologyError(f"{what} must be a non-empty string, found {show(value)}", place)
    if len(value) > limit:
        raise TopologyError(
            f"{what} {show(value)} is {len(value)} characters long; at most {limit} fit", place
        )
    if not value.isprintable() or any(c.isspace() for c in value):
        raise TopologyError(f"{what} {show(value)} has whitespace or control characters", place)
    return value


HOSTNAME_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_hostname(value: object, what: str, place: str) -> str:
    """A host's name: :func:`check_name`, and only letters, digits, '.', '-' and
    '_'. A Slurm hostlist (``n[01-99]``, ``a,b``) names several hosts: refused,
    since it would break every Slurm file and expression the name is written into."""
    name = check_name(value, what, MAX_HOSTNAME, place)
    if not HOSTNAME_CHARS.fullmatch(name):
        hint = " (a Slurm hostlist names several hosts: list each)" if any(c in name for c in "[],") else ""
        raise TopologyError(
            f"{what} {show(name)} is not a host name: use letters, digits, '.', '-' and '_', "
            f"starting with a letter or digit{hint}",
            place,
        )
    return name


def check_gpus(gpus: int, max_gpus: int, place: str) -> int:
    """A node's GPU count, refused above ``max_gpus`` (a typo or a broken
    exporter, not a machine: NVL72 trays have 4 GPUs, HGX boards 8)."""
    if gpus > max_gpus:
        raise TopologyError(
            f"{gpus} GPUs on one node is more than the {max_gpus} allowed "
            "(RACKWISE_TOPOLOGY_MAX_GPUS_PER_NODE)",
            place,
        )
    return gpus


def read_text(path: str) -> str:
    """A file's text as UTF-8, or TopologyError naming the file (and the byte)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TopologyError(f"cannot read the file: {exc.strerror}", str(path)) from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TopologyError(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}", f"{path}:{line}"
        ) from None
