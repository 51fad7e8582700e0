"""Which cluster adapter Rackwise drives: ``RACKWISE_CLUSTER`` names it. The
adapters import nothing from here, so this module (and not the interface in
``base``) is the one that knows them all."""

from __future__ import annotations

from django.conf import settings

from fleet.cluster.base import ClusterAdapter
from fleet.cluster.simulated import SimulatedAdapter
from fleet.cluster.slurm import SlurmAdapter
from fleet.cluster.webhook import WebhookAdapter

ADAPTERS: dict[str, type[ClusterAdapter]] = {
    "simulated": SimulatedAdapter,
    "slurm": SlurmAdapter,
    "webhook": WebhookAdapter,
}


def get_adapter() -> ClusterAdapter:
    """The adapter chosen by ``RACKWISE_CLUSTER`` (simulated when unset or unknown)."""
    return ADAPTERS.get(settings.RACKWISE_CLUSTER, SimulatedAdapter).from_settings()
