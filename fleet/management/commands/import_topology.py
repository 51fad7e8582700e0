"""``manage.py import_topology``: read the fleet from Kubernetes, Slurm or the
NVLink fabric the node agents report."""

from __future__ import annotations

import json

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.cluster.base import ClusterUnavailable, StepFailed
from fleet.cluster.slurm import SlurmAdapter
from fleet.services.errors import ServiceError
from fleet.services.intake.topology import import_topology
from fleet.services.read.fabric import agent_fabrics
from fleet.topology import Topology, TopologyError, agents, slurm
from fleet.topology import kubernetes as k8s
from fleet.topology.model import read_text

SOURCES = ("kubernetes", "kubernetes-api", "slurm", "slurm-live", "agents")


class Command(BaseCommand):
    help = (
        "Import racks (NVLink domains), nodes, GPU counts and node states from Kubernetes "
        "(`kubectl get nodes -o json` output, or the API), from a Slurm topology.conf (topology/block), "
        "or from the running Slurm (slurm-live: `scontrol show topology` and `scontrol show nodes --json`), "
        "or from the NVLink fabric (cluster UUID, clique) the node agents report (agents: nodes that did "
        "not report are left as they are). Prints what changed; --dry-run only prints it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", nargs="?", help="the node list (kubernetes) or topology.conf (slurm)")
        parser.add_argument("--from", dest="source", required=True, choices=SOURCES)
        parser.add_argument(
            "--rack-label",
            default=k8s.CLIQUE_LABEL,
            help="Kubernetes label naming a node's NVLink domain "
            "(default: %(default)s, keyed by its ClusterUUID part)",
        )
        parser.add_argument(
            "--kubeconfig",
            help="kubeconfig for --from kubernetes-api (default: $KUBECONFIG or ~/.kube/config)",
        )
        parser.add_argument("--context", help="kubeconfig context for --from kubernetes-api")
        parser.add_argument(
            "--nodes", help="`scontrol show nodes --json` output, for --from slurm: GPU counts and states"
        )
        parser.add_argument(
            "--gpus-per-node",
            type=int,
            default=4,
            help="GPUs of new nodes when the source does not say "
            "(slurm without --nodes; default %(default)s)",
        )
        parser.add_argument(
            "--max-age",
            type=float,
            help="for --from agents: use fabric reports at most this many seconds old "
            "(default: RACKWISE_AGENT_FABRIC_MAX_AGE_S)",
        )
        parser.add_argument("--dry-run", action="store_true", help="show what would change, write nothing")
        parser.add_argument(
            "--allow-shrink",
            action="store_true",
            help="allow removing or retiring more than RACKWISE_TOPOLOGY_MAX_SHRINK of the fleet's nodes",
        )
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args, **options) -> None:
        try:
            topology = self._read(options)
            report = import_topology(
                None,
                topology,
                dry_run=options["dry_run"],
                default_gpus=options["gpus_per_node"],
                allow_shrink=options["allow_shrink"],
            )
        except (TopologyError, ServiceError) as exc:
            raise CommandError(str(exc)) from exc
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            self.stdout.write("\n".join(report.lines()))

    def _read(self, options) -> Topology:
        source, path = options["source"], options["file"]
        max_gpus = settings.RACKWISE_TOPOLOGY_MAX_GPUS_PER_NODE
        if not 1 <= options["gpus_per_node"] <= max_gpus:
            raise CommandError(
                f"--gpus-per-node must be from 1 to {max_gpus} (RACKWISE_TOPOLOGY_MAX_GPUS_PER_NODE)"
            )
        if source == "kubernetes-api":
            if path:
                raise CommandError(
                    "--from kubernetes-api reads the API server; give --kubeconfig, not a file"
                )
            doc = k8s.fetch_nodes(options["kubeconfig"], options["context"])
            return k8s.parse_nodes(
                doc, rack_label=options["rack_label"], source="kubernetes-api", max_gpus=max_gpus
            )
        if options["max_age"] is not None and source != "agents":
            raise CommandError("--max-age is for --from agents")
        if source == "agents":
            if path:
                raise CommandError("--from agents reads the agents' reports in the database; give no file")
            max_age = options["max_age"]
            if max_age is not None and not 1 <= max_age <= 366 * 86400:
                raise CommandError("--max-age must be from 1 to 31622400 seconds (a year)")
            read = agent_fabrics(max_age)
            return agents.read_agents(read.nodes, read.racks, max_age_s=read.max_age_s)
        if source == "slurm-live":
            if path:
                raise CommandError(
                    "--from slurm-live reads the running Slurm (RACKWISE_SLURM_BIN); give no file"
                )
            return _slurm_live(max_gpus)
        if not path:
            raise CommandError(f"--from {source} needs a FILE")
        if source == "kubernetes":
            return k8s.parse_items(
                k8s.stream_items(path), rack_label=options["rack_label"], place=path, max_gpus=max_gpus
            )
        conf = slurm.parse_topology_conf(read_text(path), path)
        scontrol = None
        if options["nodes"]:
            scontrol = slurm.parse_scontrol_nodes(
                k8s.load_json(options["nodes"]), options["nodes"], max_gpus=max_gpus
            )
        return slurm.to_topology(conf, scontrol, nodes_place=options["nodes"] or "")


def _slurm_live(max_gpus: int) -> Topology:
    """Blocks and nodes from the running Slurm, through the adapter's CLI."""
    try:
        return SlurmAdapter.from_settings().topology(max_gpus=max_gpus)
    except (ClusterUnavailable, StepFailed) as exc:
        raise CommandError(f"slurm-live: {exc}") from exc
