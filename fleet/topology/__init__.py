"""Reading a fleet's topology from the systems operators already run (Kubernetes
node lists, Slurm block topology files) into one source-neutral shape, and
writing Rackwise's view back as a Slurm ``topology.conf``. Pure Python: the
import service (``fleet.services.intake.topology``) compares the result with the database."""

from fleet.topology.model import DesiredDomain, DesiredNode, Topology, TopologyError

__all__ = ["DesiredDomain", "DesiredNode", "Topology", "TopologyError"]
