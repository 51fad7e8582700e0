"""Hand a placed job to the cluster: the forms Kubernetes (with or without Kueue)
and Slurm take for the nodes Rackwise chose.

``build_export`` is pure (plain data in, plain data out); ``export_job`` reads a
job's active allocations and calls it. Read-only: nothing here writes.

- Kubernetes: a required ``nodeAffinity`` on ``kubernetes.io/hostname`` In the
  chosen hosts, and a ``podAffinity`` on the rack label (``nvidia.com/gpu.clique``
  by default, ``RACKWISE_K8S_RACK_LABEL``) among the job's own pods, so a
  rescheduled pod stays in its NVLink domain. For Kueue's Topology-Aware
  Scheduling, the pod-template annotations ``kueue.x-k8s.io/podset-required-topology``
  (locality ``required``) or ``podset-preferred-topology`` (``preferred``), and
  ``podset-slice-required-topology`` with ``podset-slice-size`` for a job split in
  rack-local segments.
- Slurm: ``--nodelist`` as a compressed hostlist (``python-hostlist``, the same
  syntax as ``scontrol show hostnames``) and ``--segment`` for ``topology/block``.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import hostlist
import yaml
from django.conf import settings

from fleet.choices import JobState, Locality
from fleet.models import Allocation, Job
from fleet.services.errors import Conflict, InvalidInput

HOSTNAME_LABEL = "kubernetes.io/hostname"
JOB_LABEL = "rackwise.io/job"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_SLICE_REQUIRED = "kueue.x-k8s.io/podset-slice-required-topology"
KUEUE_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")

# Jobs whose allocations are a placement the cluster can act on. A recovering
# job still holds its failed node until the swap, so its export would be wrong.
EXPORTABLE_STATES = (JobState.PLACED, JobState.RUNNING)


@dataclass(frozen=True)
class RackHosts:
    """The hosts a job holds in one rack (NVLink domain)."""

    name: str
    external_id: str
    hostnames: list[str]


@dataclass(frozen=True)
class PlacedJob:
    """What an export needs to know about a placed job."""

    id: int
    name: str
    locality: str
    gpus_per_node: int
    whole_nodes: bool
    racks: list[RackHosts]
    # Hostnames per rack-local segment, in placement order.
    segments: list[list[str]] = field(default_factory=list)

    @property
    def hostnames(self) -> list[str]:
        return sorted(h for r in self.racks for h in r.hostnames)


def build_export(job: PlacedJob, *, rack_label: str, queue: str | None = None) -> dict[str, Any]:
    """Both forms for a placed job. ``queue``, a Kueue LocalQueue name, puts the
    queue label and the Kueue annotations into the manifest as well."""
    return {
        "job": job.id,
        "hostnames": job.hostnames,
        "racks": [
            {"name": r.name, "external_id": r.external_id, "hostnames": sorted(r.hostnames)}
            for r in job.racks
        ],
        "kubernetes": _kubernetes(job, rack_label, queue),
        "slurm": _slurm(job),
    }


def _segment_size(job: PlacedJob) -> int:
    """The largest node count that divides every segment: the unit both Kueue
    slices and Slurm segments need to be equal. Segments of 16 and 16 give 16;
    a fallback split of 12 and 4 gives 4, each still inside one rack."""
    sizes = [len(s) for s in job.segments if s] or [len(job.hostnames)]
    return math.gcd(*sizes)


def _kubernetes(job: PlacedJob, rack_label: str, queue: str | None) -> dict[str, Any]:
    one_rack = len(job.racks) == 1
    node_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": job.hostnames}]}
            ]
        }
    }
    affinity: dict[str, Any] = {"nodeAffinity": node_affinity}
    notes: list[str] = []
    term = {"labelSelector": {"matchLabels": {JOB_LABEL: str(job.id)}}, "topologyKey": rack_label}
    if one_rack and job.locality == Locality.REQUIRED:
        affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    elif one_rack and job.locality == Locality.PREFERRED:
        affinity["podAffinity"] = {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
        }
    elif not one_rack:
        # One pod template cannot say "same rack as my segment"; the hostname
        # affinity already keeps each pod on its segment's rack.
        notes.append(
            f"the job spans {len(job.racks)} racks: no podAffinity on {rack_label}; "
            "the hostname affinity keeps each pod in its segment's rack"
        )

    annotations: dict[str, str] = {}
    if job.whole_nodes and not one_rack and job.locality != Locality.NONE:
        annotations[KUEUE_SLICE_REQUIRED] = rack_label
        annotations[KUEUE_SLICE_SIZE] = str(_segment_size(job))
    elif job.locality == Locality.REQUIRED:
        annotations[KUEUE_REQUIRED] = rack_label
    elif job.locality == Locality.PREFERRED:
        annotations[KUEUE_PREFERRED] = rack_label

    pods = len(job.hostnames)
    template_meta: dict[str, Any] = {"labels": {JOB_LABEL: str(job.id)}}
    job_labels: dict[str, str] = {JOB_LABEL: str(job.id)}
    if queue:
        job_labels[KUEUE_QUEUE_LABEL] = queue
        if annotations:
            template_meta["annotations"] = dict(annotations)
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": _k8s_name(job), "labels": job_labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "template": {
                "metadata": template_meta,
                "spec": {
                    "restartPolicy": "Never",
                    "affinity": affinity,
                    "containers": [
                        {
                            "name": "main",
                            "image": "REPLACE-ME",
                            "resources": {"limits": {"nvidia.com/gpu": job.gpus_per_node}},
                        }
                    ],
                },
            },
        },
    }
    return {
        "rack_label": rack_label,
        "affinity": affinity,
        "annotations": annotations,
        "pod_labels": {JOB_LABEL: str(job.id)},
        "notes": notes,
        "manifest": manifest,
        "manifest_yaml": yaml.safe_dump(manifest, sort_keys=False),
    }


def _k8s_name(job: PlacedJob) -> str:
    """A DNS-1123 name from the job's name and id."""
    slug = "".join(c if c.isalnum() else "-" for c in job.name.lower()).strip("-")
    return f"{slug[:40].strip('-') or 'job'}-{job.id}"


def _slurm(job: PlacedJob) -> dict[str, Any]:
    nodes = len(job.hostnames)
    # Compressed rack by rack: across racks python-hostlist would write
    # "r[1-2]-n[00-15]", a two-bracket form older Slurm hostlist parsers refuse.
    nodelist = ",".join(hostlist.collect_hostlist(r.hostnames) for r in job.racks)
    lines = [
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --nodelist={nodelist}",
        f"#SBATCH --gpus-per-node={job.gpus_per_node}",
    ]
    segment = None
    if job.whole_nodes:
        segment = _segment_size(job)
        lines.insert(2, f"#SBATCH --segment={segment}")
        lines.append("#SBATCH --exclusive")
    return {
        "nodelist": nodelist,
        "segment": segment,
        "nodes": nodes,
        "gpus_per_node": job.gpus_per_node,
        "sbatch": "\n".join(lines) + "\n",
    }


def placed_job(job: Job) -> PlacedJob:
    """Read a job's active allocations into a PlacedJob. Conflict if the job
    holds no placement the cluster can act on."""
    if job.state not in EXPORTABLE_STATES:
        raise Conflict(
            f"job #{job.pk} is {job.state}; only a placed or running job has a placement to export"
        )
    rows = (
        Allocation.objects.filter(job=job, released_at__isnull=True)
        .values_list(
            "gpu__node_id", "gpu__node__hostname", "gpu__node__rack__name", "gpu__node__rack__external_id"
        )
        .order_by()  # the model's ordering by GPU would make distinct() keep one row per GPU
        .distinct()
    )
    host_by_node: dict[str, str] = {}
    by_rack: dict[tuple[str, str], list[str]] = defaultdict(list)
    for node_id, hostname, rack, external_id in rows:
        host_by_node[str(node_id)] = hostname
        by_rack[(rack, external_id)].append(hostname)
    if not host_by_node:
        raise Conflict(f"job #{job.pk} holds no GPUs; there is nothing to export")
    recorded = (job.placement or {}).get("segments") or []
    if sorted(n for seg in recorded for n in seg) == sorted(host_by_node):
        segments = [[host_by_node[n] for n in seg] for seg in recorded]
    else:
        # Nodes swapped since placement: each rack's hosts form one segment.
        segments = [hosts for hosts in by_rack.values()]
    return PlacedJob(
        id=job.pk,
        name=job.name,
        locality=job.locality,
        gpus_per_node=job.gpus_per_node or job.num_gpus,
        whole_nodes=job.num_nodes is not None,
        racks=[RackHosts(name, ext, sorted(hosts)) for (name, ext), hosts in sorted(by_rack.items())],
        segments=segments,
    )


def export_job(job: Job, *, queue: str | None = None) -> dict[str, Any]:
    """The Kubernetes and Slurm forms of a placed or running job's placement.
    InvalidInput for a queue name Kubernetes would refuse as a label value."""
    if queue is not None and not LABEL_VALUE.fullmatch(queue):
        raise InvalidInput(
            {
                "queue": [
                    f"{queue!r} is not a Kubernetes label value (63 letters, digits, '-', '_', '.' at most)"
                ]
            }
        )
    return build_export(placed_job(job), rack_label=settings.RACKWISE_K8S_RACK_LABEL, queue=queue)
