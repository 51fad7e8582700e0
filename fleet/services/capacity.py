"""What the fleet could ever hold: used to refuse jobs that can never fit, with a
message that says what would."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from django.db.models import Count

from fleet.models import Rack


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
