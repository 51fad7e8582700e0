"""What the fleet could ever hold: used to refuse jobs that can never fit, with a
message that says what would."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db.models import Count

from fleet.choices import Locality
from fleet.models import Rack
from fleet.services.errors import InvalidInput

if TYPE_CHECKING:
    from fleet.services.jobs.submit import JobSpec


@dataclass(frozen=True)
class DomainShape:
    rack_id: int
    nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class FleetCapacity:
    domains: tuple[DomainShape, ...]

    @property
    def total_gpus(self) -> int:
        return sum(d.nodes * d.gpus_per_node for d in self.domains)

    @property
    def max_gpus_per_node(self) -> int:
        return max((d.gpus_per_node for d in self.domains), default=0)

    @property
    def dominant_gpus_per_node(self) -> int:
        """The node size holding the most GPUs: the shape a plain ``num_gpus`` gang
        is cut into."""
        weight: Counter[int] = Counter()
        for d in self.domains:
            weight[d.gpus_per_node] += d.nodes * d.gpus_per_node
        return max(weight, key=lambda g: (weight[g], g)) if weight else 0

    def nodes_of_size(self, gpus_per_node: int) -> int:
        return sum(d.nodes for d in self.domains if d.gpus_per_node >= gpus_per_node)

    def largest_domain(self, gpus_per_node: int) -> int:
        """Most nodes with at least ``gpus_per_node`` GPUs inside one NVLink domain."""
        return max((d.nodes for d in self.domains if d.gpus_per_node >= gpus_per_node), default=0)


def fleet_capacity() -> FleetCapacity:
    """Installed capacity (every node, whatever its health: failed nodes come back)."""
    rows = (
        Rack.objects.annotate(node_count=Count("nodes"))
        .filter(node_count__gt=0)
        .values_list("id", "node_count", "gpus_per_node")
    )
    return FleetCapacity(tuple(DomainShape(*row) for row in rows))


@dataclass(frozen=True)
class Shape:
    num_gpus: int
    num_nodes: int | None
    gpus_per_node: int | None
    segment_nodes: int | None


def _positive(errors: dict[str, list[str]], field: str, value: int | None) -> None:
    if value is not None and value < 1:
        errors.setdefault(field, []).append(f"must be a positive integer, got {value}")


def normalise_shape(spec: JobSpec, capacity: FleetCapacity) -> Shape:
    """Turn the request into a concrete shape, or raise InvalidInput saying why it
    can never fit and what would.

    1. Sizes must be positive and the shape given one way or the other.
    2. A job of at most one node's GPUs is a sub-node job and may share a node.
    3. A bigger job takes whole nodes as one gang, cut into the fleet's dominant
       node size unless ``gpus_per_node`` says otherwise; a GPU count that is not
       a whole number of such nodes is refused with the two counts around it
       (never rounded up to hold GPUs nobody asked for).
    4. ``segment_nodes`` (nodes that must share one domain) defaults to the whole
       gang when that fits in the largest domain.
    5. The shape must fit the installed fleet; a ``required`` segment must fit one
       domain.
    """
    errors: dict[str, list[str]] = {}
    for field in ("num_gpus", "num_nodes", "gpus_per_node", "segment_nodes"):
        _positive(errors, field, getattr(spec, field))
    if spec.locality not in Locality.values:
        errors["locality"] = [
            f"unknown locality {spec.locality!r}; use one of: " + ", ".join(Locality.values)
        ]
    if errors:
        raise InvalidInput(errors)

    if capacity.total_gpus == 0:
        raise InvalidInput("the fleet has no nodes yet; add racks before submitting jobs")

    num_gpus, num_nodes, gpn = spec.num_gpus, spec.num_nodes, spec.gpus_per_node
    if num_nodes is None and gpn is None:
        if num_gpus is None:
            raise InvalidInput({"num_gpus": ["give num_gpus, or num_nodes together with gpus_per_node"]})
    elif num_nodes is None or gpn is None:
        missing = "gpus_per_node" if num_nodes is not None else "num_nodes"
        raise InvalidInput(
            {
                missing: [
                    f"{missing} is required with "
                    f"{'num_nodes' if missing == 'gpus_per_node' else 'gpus_per_node'}"
                ]
            }
        )
    elif num_gpus is not None and num_gpus != num_nodes * gpn:
        raise InvalidInput(
            {
                "num_gpus": [
                    f"num_gpus={num_gpus} does not match num_nodes x gpus_per_node = {num_nodes * gpn}; "
                    "give one or the other"
                ]
            }
        )

    max_gpn = capacity.max_gpus_per_node
    if gpn is not None and gpn > max_gpn:
        raise InvalidInput({"gpus_per_node": [f"no node has {gpn} GPUs; the largest nodes have {max_gpn}"]})

    if num_nodes is None:
        assert num_gpus is not None
        if num_gpus <= max_gpn and spec.segment_nodes in (None, 1):
            # A sub-node job: shares a node, so segments and node counts don't apply.
            shape = Shape(num_gpus, None, None, None)
            return shape
        if num_gpus > capacity.total_gpus:
            raise InvalidInput(
                {"num_gpus": [f"asks for {num_gpus} GPUs but the whole fleet has {capacity.total_gpus}"]}
            )
        gpn = capacity.dominant_gpus_per_node
        if num_gpus % gpn:
            # Never hold more than was asked without saying so: offer the shapes that fit.
            low, high = num_gpus // gpn, num_gpus // gpn + 1
            offers = [
                f"{n * gpn} ({n} node{'s' if n > 1 else ''} of {gpn})"
                for n in (low, high)
                if n >= 1 and n * gpn <= capacity.total_gpus
            ]
            raise InvalidInput(
                {
                    "num_gpus": [
                        f"{num_gpus} GPUs is more than one node holds ({max_gpn}) and not a whole number of "
                        f"{gpn}-GPU nodes, which a multi-node job takes; ask for "
                        + " or ".join(offers)
                        + ", or give num_nodes and gpus_per_node"
                    ]
                }
            )
        num_nodes = -(-num_gpus // gpn)
    else:
        assert gpn is not None  # num_nodes comes with gpus_per_node (refused above otherwise)
        num_gpus = num_nodes * gpn

    assert gpn is not None
    # More nodes than the fleet has is refused by the field that was sent, num_nodes.
    available_nodes = capacity.nodes_of_size(gpn)
    if num_nodes > available_nodes:
        raise InvalidInput(
            {
                "num_nodes": [
                    f"asks for {num_nodes} nodes of {gpn} GPUs but the fleet has {available_nodes} such nodes"
                ]
            }
        )

    largest = capacity.largest_domain(gpn)
    segment = spec.segment_nodes
    if segment is None:
        segment = num_nodes if num_nodes <= largest else None
    else:
        if segment > num_nodes:
            raise InvalidInput(
                {"segment_nodes": [f"segment_nodes={segment} is larger than the job's {num_nodes} nodes"]}
            )
        if num_nodes % segment:
            divisors = [d for d in range(1, min(num_nodes, largest) + 1) if num_nodes % d == 0]
            raise InvalidInput(
                {
                    "segment_nodes": [
                        f"{num_nodes} nodes cannot be cut into segments of {segment}; "
                        f"use a divisor of {num_nodes} such as {', '.join(map(str, divisors[-3:]))}"
                    ]
                }
            )
        if segment > largest:
            raise InvalidInput(
                {
                    "segment_nodes": [
                        f"a segment of {segment} nodes cannot fit: "
                        f"the largest NVLink domain has {largest} nodes of {gpn} GPUs"
                    ]
                }
            )
    if spec.locality == Locality.REQUIRED and segment is None:
        raise InvalidInput(
            {
                "locality": [
                    f"a required job must fit in one NVLink domain, but {num_nodes} nodes exceed "
                    f"the largest domain ({largest} nodes, {largest * gpn} GPUs); "
                    f"set segment_nodes (a divisor of {num_nodes} up to {largest}) "
                    "to split it into rack-local segments, or use locality=preferred"
                ]
            }
        )
    return Shape(num_gpus, num_nodes, gpn, segment)
