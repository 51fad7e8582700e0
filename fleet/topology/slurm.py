"""Slurm ``topology.conf`` for ``TopologyPlugin=topology/block``, and
``scontrol show nodes --json``: read them into a Topology, and write one.

The rules a block file must follow, from Slurm's topology.conf(5) man page
(section topology/block) and the plugin that reads it
(``src/plugins/topology/block/block_record.c``, which stops slurmctld with a
fatal error when one is broken):

1. Every line is ``BlockName=<name> Nodes=<hostlist>`` or ``BlockSizes=<n>[,<n>...]``;
   parameter names are case insensitive and ``#`` starts a comment (man page).
2. "Each block should have a unique name. This field must be specified" (man
   page); a second block of the same name is fatal ("has already been defined").
3. A block needs nodes ("block %s hasn't got nodes"); at least one block must
   exist ("No blocks configured").
4. ``BlockSizes``: positive whole numbers; the first is the planning base block
   size, and "successive BlockSizes must be a power of two larger than the prior
   values" - each size is the base times 2^k, k <= 15 ("Invalid BlockSizes value").
5. "Each block must have at least the planning base block size count of nodes"
   (man page); without ``BlockSizes`` the base is the first block's node count
   ("children count lower than bblock_node_cnt").

Rackwise adds one of its own: a host is in one block only (a node lives in one
NVLink domain).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any

import hostlist

from fleet.topology.model import (
    DEFAULT_MAX_GPUS,
    DRAINING,
    FAILED,
    HEALTHY,
    MAX_EXTERNAL_ID,
    DesiredDomain,
    DesiredNode,
    Topology,
    TopologyError,
    check_domains,
    check_gpus,
    check_hostname,
    check_name,
    natural_key,
    show,
)

MAX_BLOCK_LEVEL = 15  # block_record.c refuses levels above 2^15 base blocks
# Block names end up as single tokens of a key=value line (and, for aggregated
# blocks, inside a hostlist), so keep to characters that survive both.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9._:@+-]+$")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._:@+-]")


@dataclass
class Block:
    name: str
    nodes: list[str]
    line: int = 0


@dataclass
class BlockConf:
    blocks: list[Block] = field(default_factory=list)
    block_sizes: list[int] | None = None
    block_sizes_line: int = 0
    filename: str = "topology.conf"

    def where(self, line: int) -> str:
        return f"{self.filename}:{line}" if line else self.filename


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines without comments, with a trailing backslash joining the next line
    (Slurm's config parser allows it); each keeps the number of its first line."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            out.append((start, line))
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def _pairs(line: str, where: str) -> list[tuple[str, str]]:
    pairs = []
    for token in line.split():
        key, eq, value = token.partition("=")
        if not eq or not key:
            raise TopologyError(f"expected key=value, found {token!r}", where)
        pairs.append((key.lower(), value.strip('"')))
    return pairs


def _expand(expression: str, where: str) -> list[str]:
    try:
        names = hostlist.expand_hostlist(expression)
    except hostlist.BadHostlist as exc:
        raise TopologyError(f"bad hostlist {show(expression)}: {exc}", where) from None
    if not names:
        raise TopologyError(f"hostlist {show(expression)} names no host", where)
    for name in names:
        check_hostname(name, "host name", where)
    return names


def read_topology_conf(text: str, filename: str = "topology.conf") -> BlockConf:
    """Parse the syntax of a block topology file (rules 1 and the shape of 4);
    ``check_block_rules`` applies the rest."""
    conf = BlockConf(filename=filename)
    for number, line in _logical_lines(text):
        where = conf.where(number)
        pairs = _pairs(line, where)
        first = pairs[0][0]
        if first == "switchname":
            raise TopologyError(
                "SwitchName is topology/tree; Rackwise reads topology/block files (BlockName=...)", where
            )
        if first == "blocksizes":
            if len(pairs) > 1:
                raise TopologyError("BlockSizes stands on a line of its own", where)
            if conf.block_sizes is not None:
                raise TopologyError(f"BlockSizes given twice (also line {conf.block_sizes_line})", where)
            try:
                if any(len(v) > 9 for v in pairs[0][1].split(",")):
                    raise ValueError("too many digits")
                conf.block_sizes = [int(v) for v in pairs[0][1].split(",")]
            except ValueError:
                raise TopologyError(
                    f"BlockSizes={show(pairs[0][1])} must be whole numbers separated by commas", where
                ) from None
            conf.block_sizes_line = number
            continue
        if first != "blockname":
            raise TopologyError(
                f"unknown parameter {pairs[0][0]!r}; expected BlockName= or BlockSizes=", where
            )
        name = pairs[0][1]
        if not name:
            raise TopologyError("BlockName needs a value", where)
        check_name(name, "block name", MAX_EXTERNAL_ID, where)
        nodes: str | None = None
        for key, value in pairs[1:]:
            if key != "nodes":
                raise TopologyError(f"unknown parameter {key!r} for a block; expected Nodes=", where)
            nodes = value
        if not nodes:
            raise TopologyError(f"block {name} has no Nodes=", where)
        conf.blocks.append(Block(name=name, nodes=_expand(nodes, where), line=number))
    return conf


def check_block_rules(conf: BlockConf) -> list[TopologyError]:
    """Every rule of the module docstring that ``conf`` breaks (empty: valid)."""
    problems: list[TopologyError] = []
    if not conf.blocks:
        problems.append(TopologyError("no blocks configured (no BlockName= line)", conf.filename))
        return problems
    names: dict[str, int] = {}
    hosts: dict[str, str] = {}
    for block in conf.blocks:
        if block.name in names:
            problems.append(
                TopologyError(
                    f"block {block.name} has already been defined (line {names[block.name]})",
                    conf.where(block.line),
                )
            )
        names.setdefault(block.name, block.line)
        if not NAME_PATTERN.match(block.name):
            problems.append(
                TopologyError(
                    f"block name {block.name!r} has characters Slurm cannot take", conf.where(block.line)
                )
            )
        for host in block.nodes:
            if host in hosts and hosts[host] != block.name:
                problems.append(
                    TopologyError(
                        f"host {host} is in both {hosts[host]} and {block.name}", conf.where(block.line)
                    )
                )
            hosts.setdefault(host, block.name)
    sizes = conf.block_sizes
    base = len(conf.blocks[0].nodes)
    if sizes is not None:
        where = conf.where(conf.block_sizes_line)
        if not sizes or any(s <= 0 for s in sizes):
            problems.append(TopologyError(f"BlockSizes must be positive, found {sizes}", where))
            return problems
        base = sizes[0]
        for prior, size in itertools.pairwise(sizes):
            if size <= prior:
                problems.append(TopologyError(f"BlockSizes must grow: {size} follows {prior}", where))
        for size in sizes:
            ratio = size // base
            if size % base or ratio & (ratio - 1) or ratio.bit_length() - 1 > MAX_BLOCK_LEVEL:
                problems.append(
                    TopologyError(
                        f"BlockSizes value {size} is not the base {base} times a power of two (up to 2^15)",
                        where,
                    )
                )
    for block in conf.blocks:
        if len(block.nodes) < base:
            problems.append(
                TopologyError(
                    f"block {block.name} has {len(block.nodes)} nodes, "
                    f"fewer than the planning base block size {base}",
                    conf.where(block.line),
                )
            )
    return problems


def parse_topology_conf(text: str, filename: str = "topology.conf") -> BlockConf:
    """Read and check a block topology file; the first problem raises."""
    conf = read_topology_conf(text, filename)
    problems = check_block_rules(conf)
    if problems:
        raise problems[0]
    return conf


# scontrol node states (base state plus flags), as Rackwise sees them.
_FAILED_STATES = {"DOWN", "FAIL", "FAILING", "ERROR", "NOT_RESPONDING", "UNKNOWN", "FUTURE", "NO_RESPOND"}
_DRAINING_STATES = {"DRAIN", "DRAINING", "DRAINED", "MAINTENANCE", "REBOOT_REQUESTED", "REBOOT_ISSUED"}
_GPU_GRES = re.compile(r"^gpu(?::[^:(,]+)?:(\d+)")
_GPU_TRES = re.compile(r"(?:^|,)gres/gpu=(\d+)")


def _states(raw: Any, where: str) -> list[str]:
    if isinstance(raw, str):
        # Older data_parser versions give one string such as "IDLE+DRAIN".
        return [s for s in re.split(r"[+ ,]", raw.upper()) if s]
    if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
        return [s.upper() for s in raw]
    raise TopologyError('state must be a list of strings such as ["IDLE", "DRAIN"]', f"{where}.state")


def _count(digits: str, place: str, max_gpus: int) -> int:
    if len(digits) > 9:  # int() of thousands of digits is slow, and no node has that many
        raise TopologyError(f"GPU count {show(digits)} is far more than any node has", place)
    return check_gpus(int(digits), max_gpus, place)


def _gres_gpus(node: dict[str, Any], where: str, max_gpus: int) -> int:
    gres = node.get("gres") or ""
    if not isinstance(gres, str):
        raise TopologyError('gres must be a string such as "gpu:4"', f"{where}.gres")
    for entry in gres.split(","):
        entry = entry.strip()
        if entry.startswith("gpu"):
            match = _GPU_GRES.match(entry)
            if not match:
                raise TopologyError(f"cannot read a GPU count from gres {show(entry)}", f"{where}.gres")
            return _count(match.group(1), f"{where}.gres", max_gpus)
    tres = node.get("tres") or ""
    if not isinstance(tres, str):
        raise TopologyError('tres must be a string such as "cpu=144,gres/gpu=4"', f"{where}.tres")
    match = _GPU_TRES.search(tres)
    return _count(match.group(1), f"{where}.tres", max_gpus) if match else 0


def parse_scontrol_nodes(
    doc: Any, place: str = "", *, max_gpus: int = DEFAULT_MAX_GPUS
) -> tuple[dict[str, DesiredNode], list[tuple[str, str]]]:
    """Read ``scontrol show nodes --json``: each node's GPUs (``gres``) and state.
    Returns the GPU nodes by name, and the hosts skipped (no GPUs) with why.
    Values are type-checked before they are read, names against the columns
    they go to, GPU counts against ``max_gpus``."""
    prefix = f"{place}: " if place else ""
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise TopologyError('expected an object with "nodes", as `scontrol show nodes --json` prints', place)
    nodes: dict[str, DesiredNode] = {}
    skipped: list[tuple[str, str]] = []
    for i, item in enumerate(doc["nodes"]):
        where = f"nodes[{i}]"
        if not isinstance(item, dict):
            raise TopologyError("a node must be an object", prefix + where)
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise TopologyError("a node needs a name", f"{prefix}{where}.name")
        try:
            check_hostname(name, "node name", f"{where}.name")
            states = _states(item.get("state"), where)
            gpus = _gres_gpus(item, where, max_gpus)
        except TopologyError as exc:
            raise TopologyError(exc.message, prefix + exc.place) from None
        if name in nodes:
            raise TopologyError(f"node {name} is listed twice", prefix + where)
        if gpus == 0:
            skipped.append((name, "no gpu gres in scontrol"))
            continue
        reason = item.get("reason") or ""
        if not isinstance(reason, str):
            raise TopologyError(f"reason must be a string, found {show(reason)}", f"{prefix}{where}.reason")
        label = "+".join(states)
        if _FAILED_STATES & set(states):
            state, why = FAILED, f"Slurm {label}"
        elif _DRAINING_STATES & set(states):
            state, why = DRAINING, f"Slurm {label}"
        else:
            state, why = HEALTHY, ""
        if why and reason:
            why = f"{why}: {reason}"
        nodes[name] = DesiredNode(hostname=name, gpus=gpus, state=state, reason=why[:500])
    return nodes, skipped


def to_topology(
    conf: BlockConf,
    scontrol: tuple[dict[str, DesiredNode], list[tuple[str, str]]] | None = None,
    *,
    nodes_place: str = "",
) -> Topology:
    """Blocks become NVLink domains. With scontrol output, nodes get their GPU
    counts and states; GPU nodes in no block become single-node domains; a block
    host that scontrol does not know is an error. Without it, GPUs and states
    are left to the database (``None``)."""
    known, skipped = scontrol if scontrol is not None else ({}, [])
    skipped_names = {name for name, _ in skipped}
    domains: list[DesiredDomain] = []
    where_of: dict[str, str] = {}
    for block in conf.blocks:
        members = []
        for host in block.nodes:
            where_of[host] = conf.where(block.line)
            if scontrol is None:
                members.append(DesiredNode(hostname=host))
            elif host in known:
                members.append(known[host])
            elif host in skipped_names:
                raise TopologyError(
                    f"block {block.name} names {host}, which has no GPUs in {nodes_place}",
                    conf.where(block.line),
                )
            else:
                raise TopologyError(
                    f"block {block.name} names {host}, which {nodes_place} does not list",
                    conf.where(block.line),
                )
        domains.append(DesiredDomain(name=block.name, external_id=block.name, nodes=members))
    for host in sorted(set(known) - set(where_of), key=natural_key):
        domains.append(DesiredDomain(name=host, external_id=host, nodes=[known[host]]))
    check_domains(domains, where_of)
    return Topology(source="slurm", domains=domains, skipped=list(skipped))


def block_sizes_for(base: int, blocks: int) -> list[int]:
    """The base block size and every doubling up to a size covering all blocks,
    so Slurm can still place a job that needs several blocks (with no higher
    level, nothing bigger than one block can run)."""
    levels = max(0, math.ceil(math.log2(blocks))) if blocks > 1 else 0
    return [base * 2**k for k in range(min(levels, MAX_BLOCK_LEVEL) + 1)]


def block_name(name: str, used: set[str]) -> str:
    """``name`` as a BlockName: characters Slurm cannot take in a ``key=value``
    token become ``_``, and a name already in ``used`` gets a suffix."""
    base = name if NAME_PATTERN.match(name) else _NAME_UNSAFE.sub("_", name) or "block"
    candidate, n = base, 1
    while candidate in used:
        n += 1
        candidate = f"{base}-{n}"
    used.add(candidate)
    return candidate


def render_topology_conf(
    blocks: list[tuple[str, list[str]]], block_sizes: list[int], comments: list[str]
) -> str:
    """A topology.conf for ``topology/block``: one ``BlockName`` line per block
    with its hosts as a compact hostlist, then ``BlockSizes``."""
    lines = [f"# {c}" if c else "#" for c in comments]
    for name, hosts in blocks:
        lines.append(f"BlockName={name} Nodes={hostlist.collect_hostlist(hosts)}")
    lines.append("BlockSizes=" + ",".join(str(s) for s in block_sizes))
    return "\n".join(lines) + "\n"
