"""GET /api/console/racks/?since=<cursor>: only the racks changed since an earlier
answer, which a reconnecting console applies instead of the whole fleet.

These tests commit (transaction=True): the cursor is about which transactions
have ended, and inside one test transaction that never commits nothing has."""

from __future__ import annotations

import gzip
import json
import threading

import pytest
from django.db import connection, transaction

from fleet.models import Node, Rack
from fleet.services.intake.topology import import_topology
from fleet.services.nodes import moves as node_services
from fleet.topology import DesiredDomain, DesiredNode, Topology

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/console/racks/"


def _aged(*racks: Rack) -> None:
    """Stamp racks as changed long ago, below any cursor (PostgreSQL's normal
    transaction ids start at 3). Their real stamps may not lie below a fresh
    cursor yet: the cursor is the oldest transaction running in the whole
    PostgreSQL cluster, and another test run on this server may hold one open.
    Then ``since`` answers more racks than changed: correct, but not what these
    tests count."""
    Rack.objects.filter(pk__in=[r.pk for r in racks]).update(changed_xid=1)


def _node(rack: Rack, slot: int = 0) -> Node:
    return Node.objects.get(rack=rack, slot=slot)


def test_since_answers_only_the_racks_changed_after_the_cursor(fleet, operator, viewer_client):
    r1, r2 = fleet
    _aged(r1, r2)
    first = viewer_client.get(URL).json()
    assert sorted(r["rack"] for r in first["racks"]) == first["rack_ids"] == sorted([r1.pk, r2.pk])

    node_services.drain_node(operator, _node(r2).pk, "while the console was away")
    later = viewer_client.get(URL, {"since": first["cursor"]}).json()

    assert [r["rack"] for r in later["racks"]] == [r2.pk]
    assert later["racks"][0]["version"] == Rack.objects.get(pk=r2.pk).version
    assert later["racks"][0]["nodes"][0][3] == "drained"
    assert later["rack_ids"] == sorted([r1.pk, r2.pk])
    assert later["cursor"] >= first["cursor"]


def test_since_zero_is_the_whole_snapshot(fleet, viewer_client):
    full, zero = viewer_client.get(URL).json(), viewer_client.get(URL, {"since": 0}).json()
    assert zero["racks"] == full["racks"] and len(zero["racks"]) == 2


def test_since_with_ids_applies_both_filters(fleet, operator, viewer_client):
    r1, r2 = fleet
    _aged(r1, r2)
    cursor = viewer_client.get(URL, {"ids": str(r2.pk)}).json()["cursor"]
    node_services.drain_node(operator, _node(r1).pk, "")
    node_services.drain_node(operator, _node(r2).pk, "")

    answer = viewer_client.get(URL, {"since": cursor, "ids": f"{r2.pk}"}).json()
    assert [r["rack"] for r in answer["racks"]] == [r2.pk]
    assert answer["rack_ids"] == [r2.pk]


def test_a_new_rack_comes_with_the_next_since_and_a_removed_one_leaves_rack_ids(
    fleet, operator, viewer_client
):
    r1, r2 = fleet
    cursor = viewer_client.get(URL).json()["cursor"]
    # The import keeps r1, empties r2 (removed) and brings a new rack r3.
    hosts = {
        "r1": [n.hostname for n in Node.objects.filter(rack=r1).order_by("slot")],
        "r3": [f"r3-n{i:02d}" for i in range(18)],
    }
    topology = Topology(
        source="test",
        domains=[
            DesiredDomain(name=name, external_id="", nodes=[DesiredNode(hostname=h, gpus=4) for h in hs])
            for name, hs in hosts.items()
        ],
    )
    import_topology(operator, topology, allow_shrink=True)
    r3 = Rack.objects.get(name="r3")

    answer = viewer_client.get(URL, {"since": cursor}).json()
    assert answer["rack_ids"] == sorted([r1.pk, r3.pk]) and r2.pk not in answer["rack_ids"]
    assert r3.pk in [r["rack"] for r in answer["racks"]]


def test_a_rack_created_through_inventory_is_stamped(fleet, viewer_client):
    from fleet.services.nodes.inventory import create_rack

    _aged(*fleet)
    cursor = viewer_client.get(URL).json()["cursor"]
    r9 = create_rack(None, name="r9")
    assert r9.changed_xid >= cursor and r9.version == 0
    assert [r["rack"] for r in viewer_client.get(URL, {"since": cursor}).json()["racks"]] == [r9.pk]


@pytest.mark.parametrize("since", ["-1", "abc", "1.5", "", " 1", "\u0661", str(2**63), "1" * 40, "0x10"])
def test_a_bad_since_is_refused_with_a_field_message(fleet, viewer_client, since):
    response = viewer_client.get(URL, {"since": since})
    assert response.status_code == 400
    assert list(response.json()) == ["since"] and response.json()["since"]


def test_the_largest_cursor_is_accepted(fleet, viewer_client):
    response = viewer_client.get(URL, {"since": str(2**63 - 1)})
    assert response.status_code == 200 and response.json()["racks"] == []


def test_since_is_redacted_like_the_snapshot(
    fragmented, operator, other_client, viewer_client, outsider_client
):
    a = fragmented[0]
    rack = Node.objects.get(pk=a.allocations.first().gpu.node_id).rack
    _aged(*Rack.objects.all())
    cursor = viewer_client.get(URL).json()["cursor"]
    node_services.drain_node(operator, _node(rack, 10).pk, "")

    mine = viewer_client.get(URL, {"since": cursor}).json()["racks"]
    theirs = other_client.get(URL, {"since": cursor}).json()["racks"]
    assert [r["rack"] for r in mine] == [r["rack"] for r in theirs] == [rack.pk]
    assert mine[0]["jobs"][str(a.pk)]["name"] == "a"
    assert theirs[0]["jobs"][str(a.pk)]["name"] is None and theirs[0]["jobs"][str(a.pk)]["tenant"] is None
    assert theirs[0]["jobs"][str(a.pk)]["state"] == "running"
    # A user with no Rackwise role is refused, with or without since.
    assert (
        outsider_client.get(URL, {"since": cursor}).status_code == outsider_client.get(URL).status_code == 403
    )


def test_a_since_answer_is_gzipped_when_accepted(fleet, viewer_client):
    plain = viewer_client.get(URL, {"since": 0})
    zipped = viewer_client.get(URL, {"since": 0}, headers={"accept-encoding": "gzip"})
    assert zipped["Content-Encoding"] == "gzip"
    assert json.loads(gzip.decompress(zipped.content)) == plain.json()


def test_a_change_committed_after_the_cursor_by_an_older_transaction_is_not_missed(
    fleet, operator, viewer_client
):
    """Rack A is changed by a transaction that began first (the lower id) and
    commits last; rack B by one that began later and commits at once. A client
    that read B's change must still get A's from ``since``: a cursor that were
    the highest stamp seen (B's) would skip A for good."""
    a, b = fleet
    changed, commit, failed = threading.Event(), threading.Event(), []

    def older_transaction():
        try:
            with transaction.atomic():
                node_services.drain_node(operator, _node(a).pk, "committed late")
                changed.set()
                assert commit.wait(30), "the test never let the transaction commit"
        except BaseException as exc:  # reported to the test thread
            failed.append(exc)
            changed.set()
        finally:
            connection.close()

    version_a = Rack.objects.get(pk=a.pk).version
    worker = threading.Thread(target=older_transaction)
    worker.start()
    try:
        assert changed.wait(30) and not failed, failed
        node_services.drain_node(operator, _node(b).pk, "committed at once")

        answer = viewer_client.get(URL).json()
        seen, cursor = {r["rack"]: r for r in answer["racks"]}, answer["cursor"]
        assert seen[a.pk]["version"] == version_a, "A's change is not committed yet"
        assert seen[b.pk]["nodes"][0][3] == "drained", "B's is"
    finally:
        commit.set()
        worker.join(30)
    assert not failed, failed

    stamp_a, stamp_b = (Rack.objects.get(pk=r.pk).changed_xid for r in (a, b))
    assert stamp_a < stamp_b, "A's transaction began (took its id) before B's"
    racks = {r["rack"]: r for r in viewer_client.get(URL, {"since": cursor}).json()["racks"]}
    assert a.pk in racks
    assert racks[a.pk]["version"] == version_a + 1 and racks[a.pk]["nodes"][0][3] == "drained"
