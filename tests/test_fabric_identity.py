"""The rack as a failure domain (issue #31): agents report their GPUs' NVLink
fabric (cluster UUID, clique); a node whose fabric disagrees with the rack it is
recorded in, or whose GPUs disagree among themselves, is flagged in the
attention view and in its signals."""

from __future__ import annotations

import copy

import pytest

from fleet.fabric_identity import (
    FROM_EXTERNAL_ID,
    FROM_MAJORITY,
    GPUS_DISAGREE,
    OTHER_CLIQUE,
    OTHER_DOMAIN,
    Fabric,
    NodeReport,
    RackInfo,
    fabric_counts,
    fabric_of,
    mismatches,
    parse_external_id,
    rack_fabric,
)
from fleet.models import Node, Rack
from fleet.services.intake import health
from fleet.services.read.fabric import fabric_mismatches, node_mismatch
from tests.signals_support import signals_beat
from tests.test_heartbeats import agent_client, post_beat

U1 = "6f1e2a9c-0000-4000-8000-000000000001"
U2 = "6f1e2a9c-0000-4000-8000-000000000002"
U3 = "6f1e2a9c-0000-4000-8000-000000000003"


def node(i: int, rack: int, *fabrics: Fabric) -> NodeReport:
    return NodeReport(i, f"n{i:02d}", rack, frozenset(fabrics))


A, A8, B = Fabric(U1, 7), Fabric(U1, 8), Fabric(U2, 7)


# --- the pure function ------------------------------------------------------------------


def test_an_external_id_names_a_fabric_only_as_uuid_dot_clique_or_a_bare_uuid():
    assert parse_external_id(f"{U1}.7") == (U1, 7)
    assert parse_external_id(U1.upper()) == (U1, None)
    assert parse_external_id("b1") == (None, None)
    assert parse_external_id(f"{U1}.x") == (None, None)
    assert parse_external_id(U1.replace("-", "")) == (None, None), (
        "32 bare hex digits are not the label's form"
    )
    assert parse_external_id("") == (None, None)
    assert fabric_of(None, 7) is None, "no cluster yet: nothing reported"
    assert fabric_of(U1.upper(), "7") == A


def test_a_node_in_another_domain_than_most_of_its_rack_is_flagged_with_the_rack_its_fabric_says():
    racks = [RackInfo(1, "r1"), RackInfo(2, "r2")]
    nodes = [node(1, 1, A), node(2, 1, A), node(3, 1, B), node(4, 2, B), node(5, 2, B)]

    [m] = mismatches(racks, nodes)

    assert (m.hostname, m.kind, m.rack, m.fabric_rack, m.fabric_rack_id) == (
        "n03",
        OTHER_DOMAIN,
        "r1",
        "r2",
        2,
    )
    assert (m.expected.cluster_uuid, m.expected.clique_id, m.expected.source) == (U1, 7, FROM_MAJORITY)
    assert (
        m.text
        == f"n03: recorded in r1 (fabric {U1}), but its GPUs report fabric {U2}.7 (the fabric of rack r2)"
    )


def test_a_single_reporting_node_is_never_in_disagreement_and_a_tie_flags_nobody():
    assert mismatches([RackInfo(1, "r1")], [node(1, 1, B)]) == []
    tie = [node(1, 1, A), node(2, 1, B)]
    assert mismatches([RackInfo(1, "r1")], tie) == []
    assert rack_fabric(RackInfo(1, "r1"), fabric_counts(tie)[1]).note == "a tie: 1 of 2 reporting nodes each"
    # Three fabrics, none with more than half: no majority either.
    three = [node(1, 1, A), node(2, 1, A), node(3, 1, B), node(4, 1, Fabric(U3, 7))]
    assert mismatches([RackInfo(1, "r1")], three) == []
    note = rack_fabric(RackInfo(1, "r1"), fabric_counts(three)[1]).note
    assert note == "no majority: at most 2 of 4 reporting nodes agree"


def test_a_rack_recorded_with_its_fabric_flags_even_a_single_node_that_disagrees():
    [m] = mismatches([RackInfo(1, "r1", f"{U2}.7")], [node(1, 1, A)])
    assert (m.kind, m.expected.source, m.expected.cluster_uuid) == (OTHER_DOMAIN, FROM_EXTERNAL_ID, U2)


def test_a_node_in_another_clique_of_its_racks_domain_is_a_partition_apart():
    # The rack is recorded by its cluster UUID (as a Kubernetes clique import keys
    # it): the clique is what most of its nodes say.
    rack = RackInfo(1, "r1", U1)
    [m] = mismatches([rack], [node(1, 1, A), node(2, 1, A), node(3, 1, A8)])
    assert (m.hostname, m.kind, m.fabric_rack) == ("n03", OTHER_CLIQUE, "")
    assert "whose nodes are in clique 7, but its GPUs report clique 8" in m.text
    # Half and half: a partitioned rack, not a misconfigured node.
    assert mismatches([rack], [node(1, 1, A), node(2, 1, A8)]) == []
    # A rack recorded per clique names the partition: the other clique's node is flagged.
    [m] = mismatches(
        [RackInfo(1, "r1", f"{U1}.7"), RackInfo(2, "r1b", f"{U1}.8")], [node(1, 1, A), node(3, 1, A8)]
    )
    assert (m.hostname, m.kind, m.fabric_rack) == ("n03", OTHER_CLIQUE, "r1b")


def test_a_node_whose_gpus_disagree_is_flagged_whatever_its_rack_says():
    [m] = mismatches([RackInfo(1, "r1")], [node(1, 1, A, B)])
    assert (m.kind, [str(f) for f in m.reported]) == (GPUS_DISAGREE, [f"{U1}.7", f"{U2}.7"])
    assert m.text == f"n01: its GPUs report different NVLink fabrics ({U1}.7, {U2}.7)"
    # It takes no part in its rack's majority.
    found = mismatches([RackInfo(1, "r1")], [node(1, 1, A, B), node(2, 1, A), node(3, 1, B)])
    assert [(m.hostname, m.kind) for m in found] == [("n01", GPUS_DISAGREE)], "a tie of the other two"


def test_the_rack_its_fabric_says_is_named_only_when_one_rack_has_it():
    racks = [RackInfo(1, "r1"), RackInfo(2, "r2"), RackInfo(3, "r3")]
    nodes = [node(1, 1, A), node(2, 1, A), node(3, 1, B), node(4, 2, B), node(5, 3, B)]
    [m] = mismatches(racks, nodes)
    assert (m.kind, m.fabric_rack, m.fabric_rack_id) == (OTHER_DOMAIN, "", None)
    assert m.text.endswith("(no rack has it)")


def test_nodes_that_reported_nothing_are_never_flagged():
    assert mismatches([RackInfo(1, "r1", f"{U2}.7")], [node(1, 1)]) == []


# --- through heartbeats, the attention view and the node's signals -----------------------


@pytest.fixture
def beat(fleet, django_capture_on_commit_callbacks):
    """beat(hostname, cluster_uuid, clique_id, imex=..., per_gpu={index: (uuid, clique)})."""

    def send(hostname: str, cluster: str, clique: int = 7, imex: str = "ready", per_gpu=None) -> None:
        host = Node.objects.get(hostname=hostname)
        payload = signals_beat(fabric__cluster_uuid=cluster, fabric__clique_id=clique)
        payload["imex"] = {"status": imex, "detail": "" if imex == "ready" else "no quorum"}
        for index, (u, c) in (per_gpu or {}).items():
            gpu = payload["gpus"][index]["signals"]
            gpu["fabric"] = copy.deepcopy(gpu["fabric"]) | {"cluster_uuid": u, "clique_id": c}
        client = agent_client(health.issue_agent_token(None, host.pk))
        with django_capture_on_commit_callbacks(execute=True):
            assert post_beat(client, host, payload).status_code == 200

    return send


@pytest.fixture
def miswired(beat):
    """r1's first three nodes report fabric U1, r2's U2; r1-n03 reports U2 (it is
    cabled into r2's NVLink domain); r2-n05's GPU 2 reports U1 (misconfigured)."""
    for i in range(3):
        beat(f"r1-n{i:02d}", U1)
        beat(f"r2-n{i:02d}", U2)
    beat("r1-n03", U2)
    beat("r2-n05", U2, per_gpu={2: (U1, 7)})


def test_a_miswired_node_is_listed_in_the_attention_view_after_degraded_racks(miswired, beat, viewer_client):
    beat("r2-n00", U2, imex="unavailable")
    beat("r2-n01", U2, imex="unavailable")

    body = viewer_client.get("/api/attention/").json()

    assert [i["key"] for i in body["items"]][:2] == ["racks_degraded", "fabric_mismatch"]
    item = body["items"][1]
    assert item["count"] == 2 == body["fabric_mismatch"]
    assert item["text"] == (
        "2 nodes whose NVLink fabric disagrees with their rack: r1-n03 (in r1, fabric of r2), "
        "r2-n05 (in r2: its GPUs disagree)"
    )
    assert item["url"] == f"/racks/{Rack.objects.get(name='r1').pk}/"
    listed = {m["hostname"]: m for m in body["fabric_mismatches"]}
    assert listed["r1-n03"]["kind"] == "other_domain" and listed["r1-n03"]["fabric_rack"] == "r2"
    assert listed["r1-n03"]["expected"] == {
        "cluster_uuid": U1,
        "clique_id": 7,
        "source": "majority",
        "note": "",
    }
    assert listed["r2-n05"]["reported"] == [f"{U1}.7", f"{U2}.7"]


def test_a_nodes_signals_say_how_its_fabric_disagrees_with_its_rack(miswired, viewer_client):
    def mismatch(hostname: str):
        node_id = Node.objects.get(hostname=hostname).pk
        return viewer_client.get(f"/api/nodes/{node_id}/signals/").json()["fabric_mismatch"]

    assert mismatch("r1-n00") is None
    assert mismatch("r1-n17") is None, "reported nothing: not judged"
    m = mismatch("r1-n03")
    assert (m["kind"], m["rack"], m["fabric_rack"], m["reported"]) == (
        "other_domain",
        "r1",
        "r2",
        [f"{U2}.7"],
    )
    assert m["fabric_rack_id"] == Rack.objects.get(name="r2").pk
    assert mismatch("r2-n05")["kind"] == "gpus_disagree"


def test_a_gpu_not_yet_in_a_cluster_neither_hides_the_nodes_fabric_nor_disagrees(beat, viewer_client):
    for i in range(3):
        beat(f"r1-n{i:02d}", U1)
    beat("r1-n03", U2, per_gpu={0: (None, 0)})

    body = viewer_client.get(f"/api/nodes/{Node.objects.get(hostname='r1-n03').pk}/signals/").json()

    assert body["fabric"] == {"cluster_uuid": U2, "clique_id": 7}, "GPU 1's: GPU 0 is in no cluster yet"
    assert body["fabric_mismatch"]["kind"] == "other_domain"


def test_a_fabric_reported_longer_ago_than_the_bound_is_not_used(beat, clock, viewer_client, settings):
    for i in range(3):
        beat(f"r1-n{i:02d}", U1)
    beat("r1-n03", U2)
    assert [m.hostname for m in fabric_mismatches()] == ["r1-n03"]

    clock.at = 11  # minutes: past RACKWISE_AGENT_FABRIC_MAX_AGE_S (600 s)
    for i in range(3):
        beat(f"r1-n{i:02d}", U1)

    assert fabric_mismatches() == [], "r1-n03's report is stale: perhaps before it was recabled"
    settings.RACKWISE_AGENT_FABRIC_MAX_AGE_S = 3600
    assert [m.hostname for m in fabric_mismatches()] == ["r1-n03"]


def test_the_checks_read_a_fixed_number_of_queries_however_many_nodes_report(
    miswired, beat, django_assert_num_queries
):
    for i in range(6, 18):
        beat(f"r1-n{i:02d}", U1)
    n00 = Node.objects.select_related("rack").get(hostname="r1-n00")
    n03 = Node.objects.select_related("rack").get(hostname="r1-n03")

    with django_assert_num_queries(1):  # the rack's readings
        assert node_mismatch(n00) is None
    with django_assert_num_queries(4):  # the rack's readings; then the fleet's (below)
        assert node_mismatch(n03).fabric_rack == "r2"
    # Counts by rack and fabric, the racks, then the nodes of the racks where a
    # count disagrees (r1) or a node's GPUs do (r2).
    with django_assert_num_queries(3):
        assert [m.hostname for m in fabric_mismatches()] == ["r1-n03", "r2-n05"]
    # A sound fleet: the counts and the racks only.
    beat("r1-n03", U1)
    beat("r2-n05", U2)
    with django_assert_num_queries(2):
        assert fabric_mismatches() == []
