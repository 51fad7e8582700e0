"""Placement export: a placed job in the forms Kubernetes (with Kueue) and Slurm
take, through the API and on the job page."""

from __future__ import annotations

import hostlist
import pytest
import yaml
from django.test import Client

from fleet.models import Node
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes.moves import mark_node_failed


def _submit(user, **shape):
    shape.setdefault("name", "llama")
    shape.setdefault("tenant", "llm")
    return submit_job(user, JobSpec(**shape))


def _place(job, nodes: list[Node], *, segments: list[list[Node]] | None = None):
    gpus = list(range(job.gpus_per_node or job.num_gpus))
    return apply_placement(
        None,
        job.pk,
        {n.pk: gpus for n in nodes},
        reason="test placement",
        segments=[[str(n.pk) for n in seg] for seg in segments] if segments else None,
    )


def _nodes(rack, count: int, start: int = 0) -> list[Node]:
    return list(Node.objects.filter(rack=rack).order_by("slot")[start : start + count])


def _export(client, job, **params):
    return client.get(f"/api/jobs/{job.pk}/export/", params)


@pytest.fixture
def placed_gang(fleet, submitter):
    """A required 16-node job placed on r1's first 16 nodes."""
    job = _submit(submitter, num_nodes=16, gpus_per_node=4)
    return _place(job, _nodes(fleet[0], 16))


def test_a_slurm_nodelist_expands_back_to_exactly_the_allocated_hosts(placed_gang, submitter_client):
    body = _export(submitter_client, placed_gang).json()

    allocated = sorted(
        Node.objects.filter(gpus__allocations__job=placed_gang).distinct().values_list("hostname", flat=True)
    )
    assert body["slurm"]["nodelist"] == "r1-n[00-15]"
    assert hostlist.expand_hostlist(body["slurm"]["nodelist"]) == allocated
    assert body["slurm"]["nodes"] == 16
    assert body["slurm"]["segment"] == 16
    assert body["slurm"]["gpus_per_node"] == 4
    assert "#SBATCH --nodelist=r1-n[00-15]\n" in body["slurm"]["sbatch"]
    assert "#SBATCH --segment=16\n" in body["slurm"]["sbatch"]


def test_a_nodelist_over_racks_with_the_same_slots_keeps_one_bracket_per_rack(
    fleet, submitter, submitter_client
):
    r1, r2 = fleet
    job = _submit(submitter, num_nodes=24, gpus_per_node=4, segment_nodes=12)
    first, second = _nodes(r1, 12), _nodes(r2, 12)
    _place(job, first + second, segments=[first, second])

    nodelist = _export(submitter_client, job).json()["slurm"]["nodelist"]

    assert nodelist == "r1-n[00-11],r2-n[00-11]"  # not r[1-2]-n[00-11]
    assert sorted(hostlist.expand_hostlist(nodelist)) == sorted(n.hostname for n in first + second)


def test_a_job_across_two_racks_round_trips_and_is_cut_into_rack_local_segments(
    fleet, submitter, submitter_client
):
    r1, r2 = fleet
    job = _submit(submitter, num_nodes=24, gpus_per_node=4, segment_nodes=12)
    first, second = _nodes(r1, 12, start=3), _nodes(r2, 12, start=5)
    _place(job, first + second, segments=[first, second])

    body = _export(submitter_client, job).json()

    expanded = hostlist.expand_hostlist(body["slurm"]["nodelist"])
    assert sorted(expanded) == sorted(n.hostname for n in first + second)
    assert body["slurm"]["nodelist"] == "r1-n[03-14],r2-n[05-16]"
    assert body["slurm"]["segment"] == 12
    k8s = body["kubernetes"]
    assert k8s["annotations"] == {
        "kueue.x-k8s.io/podset-slice-required-topology": "nvidia.com/gpu.clique",
        "kueue.x-k8s.io/podset-slice-size": "12",
    }
    # One pod template cannot keep each pod with its own segment: no rack podAffinity.
    assert "podAffinity" not in k8s["affinity"]
    assert k8s["notes"]
    assert [r["name"] for r in body["racks"]] == ["r1", "r2"]


def test_unequal_segments_export_the_largest_segment_size_that_divides_them(
    fleet, submitter, submitter_client
):
    r1, r2 = fleet
    job = _submit(submitter, num_nodes=20, gpus_per_node=4, segment_nodes=4)
    big, small = _nodes(r1, 16), _nodes(r2, 4)
    _place(job, big + small, segments=[big, small])

    body = _export(submitter_client, job).json()

    assert body["slurm"]["segment"] == 4
    assert body["kubernetes"]["annotations"]["kueue.x-k8s.io/podset-slice-size"] == "4"


def test_a_required_job_in_one_rack_gets_hostname_affinity_and_required_rack_affinity(
    placed_gang, submitter_client, settings
):
    settings.RACKWISE_K8S_RACK_LABEL = "ds.coreweave.com/nvlink.domain"

    k8s = _export(submitter_client, placed_gang).json()["kubernetes"]

    terms = k8s["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/hostname",
                    "operator": "In",
                    "values": [f"r1-n{i:02d}" for i in range(16)],
                }
            ]
        }
    ]
    [pod_term] = k8s["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert pod_term["topologyKey"] == "ds.coreweave.com/nvlink.domain"
    assert pod_term["labelSelector"] == {"matchLabels": {"rackwise.io/job": str(placed_gang.pk)}}
    assert k8s["pod_labels"] == {"rackwise.io/job": str(placed_gang.pk)}
    assert k8s["annotations"] == {"kueue.x-k8s.io/podset-required-topology": "ds.coreweave.com/nvlink.domain"}


def test_a_preferred_job_gets_preferred_rack_affinity_and_the_preferred_kueue_annotation(
    fleet, submitter, submitter_client
):
    job = _place(_submit(submitter, num_nodes=4, gpus_per_node=4, locality="preferred"), _nodes(fleet[1], 4))

    k8s = _export(submitter_client, job).json()["kubernetes"]

    [weighted] = k8s["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert weighted["weight"] == 100
    assert weighted["podAffinityTerm"]["topologyKey"] == "nvidia.com/gpu.clique"
    assert k8s["annotations"] == {"kueue.x-k8s.io/podset-preferred-topology": "nvidia.com/gpu.clique"}


def test_a_kueue_queue_puts_the_queue_label_and_annotations_into_the_manifest(placed_gang, submitter_client):
    k8s = _export(submitter_client, placed_gang, queue="tas-user-queue").json()["kubernetes"]

    manifest = yaml.safe_load(k8s["manifest_yaml"])
    assert manifest == k8s["manifest"]
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "tas-user-queue"
    template = manifest["spec"]["template"]
    assert template["metadata"]["annotations"] == k8s["annotations"]
    assert template["metadata"]["labels"] == {"rackwise.io/job": str(placed_gang.pk)}
    assert manifest["spec"]["completions"] == manifest["spec"]["parallelism"] == 16
    assert template["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 4}
    assert template["spec"]["affinity"] == k8s["affinity"]


def test_without_a_queue_the_manifest_carries_no_kueue_metadata(placed_gang, submitter_client):
    manifest = _export(submitter_client, placed_gang).json()["kubernetes"]["manifest"]

    assert "kueue.x-k8s.io/queue-name" not in manifest["metadata"]["labels"]
    assert "annotations" not in manifest["spec"]["template"]["metadata"]


def test_a_queue_name_kubernetes_would_refuse_is_a_400_naming_the_field(placed_gang, submitter_client):
    response = _export(submitter_client, placed_gang, queue="no spaces/allowed")

    assert response.status_code == 400
    assert "queue" in response.json()


def test_a_job_sharing_a_node_exports_one_host_without_a_segment(fleet, submitter, submitter_client):
    job = _submit(submitter, num_gpus=2)
    node = _nodes(fleet[0], 1, start=17)[0]
    apply_placement(None, job.pk, {node.pk: [0, 1]}, reason="test placement")

    body = _export(submitter_client, job).json()

    assert body["slurm"]["nodelist"] == "r1-n17"
    assert body["slurm"]["segment"] is None
    assert body["slurm"]["gpus_per_node"] == 2
    assert "--segment" not in body["slurm"]["sbatch"]
    assert "--exclusive" not in body["slurm"]["sbatch"]
    assert body["kubernetes"]["manifest"]["spec"]["completions"] == 1


def test_a_running_job_still_exports(placed_gang, submitter_client):
    start_job(None, placed_gang.pk)

    assert _export(submitter_client, placed_gang).status_code == 200


def test_a_pending_job_is_refused_with_409_saying_why(fleet, submitter, submitter_client):
    job = _submit(submitter, num_nodes=4, gpus_per_node=4)

    response = _export(submitter_client, job)

    assert response.status_code == 409
    assert "pending" in response.json()["detail"]
    assert "placed or running" in response.json()["detail"]


def test_a_recovering_job_is_refused_with_409_until_its_failed_node_is_replaced(
    placed_gang, operator, submitter_client
):
    start_job(None, placed_gang.pk)
    mark_node_failed(operator, _nodes(placed_gang.allocations.first().gpu.node.rack, 1)[0].pk, "XID 79")

    response = _export(submitter_client, placed_gang)

    assert response.status_code == 409
    assert "recovering" in response.json()["detail"]


@pytest.mark.parametrize(
    ("persona", "status"),
    [
        ("submitter_client", 200),
        ("viewer_client", 200),
        ("operator_client", 200),
        ("other_client", 404),
        ("outsider_client", 403),
        ("anon_client", 401),
    ],
)
def test_export_is_visible_exactly_to_those_who_see_the_job(placed_gang, request, persona, status):
    assert _export(request.getfixturevalue(persona), placed_gang).status_code == status


def _page(user, job) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/jobs/{job.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def test_the_job_page_shows_both_forms_for_a_placed_job(placed_gang, submitter):
    page = _page(submitter, placed_gang)

    assert 'data-testid="export-slurm"' in page
    assert "#SBATCH --nodelist=r1-n[00-15]" in page
    assert 'data-testid="export-kubernetes"' in page
    assert "kubernetes.io/hostname" in page
    assert "kueue.x-k8s.io/podset-required-topology" in page


def test_the_job_page_of_a_pending_job_hides_the_empty_export(fleet, submitter):
    job = _submit(submitter, num_nodes=4, gpus_per_node=4)

    page = _page(submitter, job)

    assert '<div data-testid="export-panel" hidden>' in page  # job.js fills it once placed
    assert "#SBATCH" not in page
