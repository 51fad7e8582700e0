"""`manage.py import_topology --from agents` (issue #31): racks built from the
NVLink fabric the node agents report, through the import service (dry run,
shrink guard, report); nodes that reported nothing, or only long ago, stay
where they are."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from fleet.fabric_identity import Fabric
from fleet.models import GPU, AuditEvent, Node, Rack
from fleet.services.intake import health
from fleet.services.read.fabric import fabric_mismatches
from fleet.topology.agents import AgentNode, RecordedRack, read_agents
from tests.signals_support import signals_beat
from tests.test_fabric_identity import U1, U2, U3
from tests.test_heartbeats import agent_client, post_beat

pytestmark = pytest.mark.django_db
DATA = Path(__file__).resolve().parent / "data"
K8S_R1 = "5b3e2c1a-8f4d-4e6b-9a7c-1d2e3f405a61"  # tests/data/k8s_gb200_nodes.json's ClusterUUIDs
K8S_R2 = "7c9d1e2f-0a3b-4c5d-8e6f-2a3b4c5d6e72"


def run(*args: str) -> str:
    out = StringIO()
    call_command("import_topology", "--from", "agents", *args, stdout=out)
    return out.getvalue()


def hosts(rack: str) -> list[str]:
    return list(Node.objects.filter(rack__name=rack).order_by("slot").values_list("hostname", flat=True))


@pytest.fixture
def beat(fleet, django_capture_on_commit_callbacks):
    def send(hostname: str, cluster: str, clique: int = 7) -> None:
        node = Node.objects.get(hostname=hostname)
        payload = signals_beat(fabric__cluster_uuid=cluster, fabric__clique_id=clique)
        client = agent_client(health.issue_agent_token(None, node.pk))
        with django_capture_on_commit_callbacks(execute=True):
            assert post_beat(client, node, payload).status_code == 200

    return send


@pytest.fixture
def reported(beat):
    """r1's nodes report fabric U1 but r1-n17, which reports U2, as r2's first
    twelve nodes do; r2-n12..n17 report nothing."""
    for i in range(17):
        beat(f"r1-n{i:02d}", U1)
    beat("r1-n17", U2)
    for i in range(12):
        beat(f"r2-n{i:02d}", U2)


def test_racks_take_their_fabric_and_a_node_cabled_into_another_moves_there(reported):
    output = run()

    r1, r2 = Rack.objects.get(name="r1"), Rack.objects.get(name="r2")
    assert (r1.external_id, r2.external_id) == (U1, U2), "the racks holding most of each fabric's nodes"
    assert hosts("r1") == [f"r1-n{i:02d}" for i in range(17)]
    assert hosts("r2") == ["r1-n17"] + [f"r2-n{i:02d}" for i in range(18)], "hostnames' natural order"
    assert GPU.objects.filter(node__hostname="r1-n17").count() == 4
    assert "agents import: 2 racks, 30 nodes in the source" in output
    assert "nodes moved (1):\n  r1-n17: r1 -> r2" in output
    assert f"racks given the source's id (2):\n  r1: none -> {U1}\n  r2: none -> {U2}" in output
    # Nodes that did not report are left where they were, and the report says so.
    assert (
        "left as they are, no fabric reported (6): r2-n12, r2-n13, r2-n14, r2-n15, r2-n16, r2-n17" in output
    )
    assert Node.objects.count() == 36
    assert AuditEvent.objects.filter(action="rack.import").count() == 2

    assert run().strip().endswith("no changes"), "importing the same reports again changes nothing"


def test_a_dry_run_shows_the_moves_and_writes_nothing(reported):
    output = run("--dry-run")

    assert "r1-n17: r1 -> r2" in output and "dry run: nothing written" in output
    assert hosts("r1") == [f"r1-n{i:02d}" for i in range(18)]
    assert not Rack.objects.exclude(external_id="").exists()
    assert not AuditEvent.objects.filter(action="rack.import").exists()


def test_stale_reports_are_not_used_and_the_report_counts_them(beat, clock):
    for i in range(18):
        beat(f"r1-n{i:02d}", U1)
    beat("r2-n00", U2)
    clock.at = 11  # minutes: r1-n16 and r1-n17 fall silent, past the 600 s bound
    for i in range(16):
        beat(f"r1-n{i:02d}", U1)
    beat("r2-n00", U1)  # now in r1's fabric: it moves

    output = run()

    assert "17 nodes reported their NVLink fabric in the last 600 s" in output
    assert "left as they are, fabric reported more than 600 s ago, stale (2): r1-n16, r1-n17" in output
    assert hosts("r1")[-3:] == ["r1-n16", "r1-n17", "r2-n00"], "the stale nodes stay in r1"
    assert Node.objects.count() == 36

    # With a longer bound they count again (and change nothing: they are in r1).
    assert "stale" not in run("--max-age", "3600")


def test_nothing_reported_changes_nothing(fleet):
    output = run()

    assert "0 nodes reported their NVLink fabric in the last 600 s" in output
    assert "left as they are, no fabric reported (36): r1-n00" in output
    assert output.strip().endswith("no changes")
    assert Node.objects.count() == 36


def test_a_fabric_with_no_rack_becomes_a_new_rack_named_after_its_hosts(beat):
    for i in range(18):
        beat(f"r1-n{i:02d}", U1)
    for i in range(9, 18):
        beat(f"r2-n{i:02d}", U3)
    for i in range(9):
        beat(f"r2-n{i:02d}", U2)

    report = json.loads(run("--json"))

    # r2's two halves report two fabrics: the first (by UUID, on a tie) keeps r2;
    # the other is new, named after its hosts if that names no rack, else its UUID.
    assert Rack.objects.get(name="r2").external_id == U2
    new = Rack.objects.get(external_id=U3)
    assert new.name == U3, "'r2' is taken"
    assert hosts(U3) == [f"r2-n{i:02d}" for i in range(9, 18)]
    assert report["racks_added"] == [f"{U3} (9 x 4 GPUs)"]
    assert report["notes"][0].startswith("36 nodes reported")


def test_a_rack_recorded_per_clique_takes_that_cliques_nodes(beat):
    Rack.objects.filter(name="r1").update(external_id=f"{U1}.7")
    Rack.objects.filter(name="r2").update(external_id=f"{U1}.8")
    for i in range(18):
        beat(f"r1-n{i:02d}", U1, clique=7)
    beat("r2-n00", U1, clique=7)
    beat("r2-n01", U1, clique=8)

    output = run()

    assert "r2-n00: r2 -> r1" in output and "r2-n01" not in output
    assert Rack.objects.get(name="r1").external_id == f"{U1}.7", "its id is kept"


def test_after_a_kubernetes_import_the_agents_agree_on_the_racks_and_move_a_miswired_node(
    db, django_capture_on_commit_callbacks
):
    """Both sources key a rack by its ClusterUUID, so they do not undo each
    other; a node whose fabric is another rack's moves there."""
    call_command(
        "import_topology", "--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"), stdout=StringIO()
    )
    r1, r2 = Rack.objects.get(external_id=K8S_R1), Rack.objects.get(external_id=K8S_R2)

    def send(hostname: str, cluster: str) -> None:
        node = Node.objects.get(hostname=hostname)
        payload = signals_beat(fabric__cluster_uuid=cluster, fabric__clique_id=32766)
        client = agent_client(health.issue_agent_token(None, node.pk))
        with django_capture_on_commit_callbacks(execute=True):
            assert post_beat(client, node, payload).status_code == 200

    for i in (1, 2, 3):
        send(f"gb200-r1-n{i:02d}", K8S_R1)
        send(f"gb200-r2-n{i:02d}", K8S_R2)
    assert run().strip().endswith("no changes")

    send("gb200-r1-n04", K8S_R2)
    [flagged] = fabric_mismatches()
    assert (flagged.hostname, flagged.rack, flagged.fabric_rack) == ("gb200-r1-n04", r1.name, r2.name)
    assert f"gb200-r1-n04: {r1.name} -> {r2.name}" in run()
    assert fabric_mismatches() == []
    assert Node.objects.get(hostname="gb200-r1-n04").rack_id == r2.pk
    assert Rack.objects.get(pk=r1.pk).nodes_per_domain == 17


def test_the_agents_source_takes_no_file_and_max_age_is_for_it_only(fleet):
    with pytest.raises(CommandError, match="give no file"):
        call_command("import_topology", "--from", "agents", "nodes.json")
    with pytest.raises(CommandError, match="--max-age is for --from agents"):
        call_command("import_topology", "--from", "slurm-live", "--max-age", "60")
    with pytest.raises(CommandError, match="--max-age must be from 1"):
        run("--max-age", "0")


def test_a_slurm_block_rack_keeps_its_name_and_id_while_its_nodes_follow_the_fabric():
    nodes = [AgentNode(f"n{i}", 4, "b1", frozenset({Fabric(U1, 7)})) for i in range(3)]
    nodes += [AgentNode("m0", 4, "b2", frozenset({Fabric(U1, 7)})), AgentNode("m1", 4, "b2")]
    topology = read_agents(nodes, [RecordedRack("b1", "b1"), RecordedRack("b2", "b2")], max_age_s=600)

    [domain] = topology.domains
    assert (domain.name, domain.external_id) == ("b1", "b1"), "a Slurm import still matches it"
    assert [n.hostname for n in domain.nodes] == ["m0", "n0", "n1", "n2"]
    assert topology.partial and "no fabric reported (1): m1" in topology.notes[1]
