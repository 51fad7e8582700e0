"""The page survives a cut websocket: it shows it is disconnected, reconnects by
itself, and repaints what it missed while away from ``?since=`` (the racks
changed since its last snapshot), dropping a rack removed meanwhile."""

from __future__ import annotations

import pytest

from fleet.models import Node, Rack
from fleet.services.intake.topology import import_topology
from fleet.services.nodes import moves as node_services
from fleet.topology import DesiredDomain, DesiredNode, Topology
from tests.browser.helpers import in_thread, log_in_as, open_live, rack_version

pytestmark = pytest.mark.browser


def _console_fetches(page) -> list[str]:
    """The query strings of the page's console snapshot requests, as they go out."""
    fetched: list[str] = []
    page.on("request", lambda r: "/api/console/racks/" in r.url and fetched.append(r.url.partition("?")[2]))
    return fetched


def test_the_page_recovers_after_the_websocket_is_cut(page, server, fleet, operator):
    rack = fleet[0]
    node = Node.objects.filter(rack=rack).order_by("slot").first()
    fetched = _console_fetches(page)
    log_in_as(page, operator)
    open_live(page)
    seen = rack_version(page, rack.pk)
    cursor = page.evaluate("window.rackwise.cursor")
    assert fetched and all("since=" not in q for q in fetched), "the first load is the whole snapshot"
    first_load = len(fetched)

    server.stop()  # every socket drops; events sent meanwhile reach no one
    page.wait_for_function("document.body.dataset.ws === 'closed'")
    assert "disconnected" in page.text_content("[data-testid=ws-status]")
    in_thread(node_services.drain_node, operator, node.pk, "maintenance while the console is away")
    version = Rack.objects.get(pk=rack.pk).version
    assert version > seen

    server.start()
    page.wait_for_function(
        "document.body.dataset.ws === 'open' && "
        f"Number(document.querySelector('article.rack[data-rack-id=\"{rack.pk}\"]').dataset.version)"
        f" >= {version}",
        timeout=20000,
    )
    assert (
        page.evaluate(f"window.rackwise.cellState({node.pk}, 0).nodeState") == "draining"
        or page.evaluate(f"window.rackwise.cellState({node.pk}, 0).nodeState") == "drained"
    )
    # Drawn, not only applied: the node's four cells carry the drain pattern's letter.
    page.wait_for_function(
        f"window.rackwiseGrid.cells('main').filter(c => c.node === {node.pk} && "
        "c.state.startsWith('drain') && c.letter === 'D').length === 4"
    )
    # The reconnect asked only for what changed since the last answer.
    assert fetched[first_load:] == [f"since={cursor}"]
    assert page.evaluate("window.rackwise.cursor") >= cursor


def test_a_rack_removed_while_disconnected_is_dropped_on_reconnect(page, server, fleet, operator):
    kept, removed = fleet
    fetched = _console_fetches(page)
    log_in_as(page, operator)
    open_live(page)
    gone_node = Node.objects.filter(rack=removed).order_by("slot").first()
    assert page.evaluate(f"window.rackwise.cellState({gone_node.pk}, 0)") is not None
    removals = page.evaluate(
        "(() => { const ids = []; window.rackwise.live.on('removed', (id) => ids.push(id)); "
        "window.__removed = ids; return ids.length; })()"
    )
    assert removals == 0

    server.stop()
    page.wait_for_function("document.body.dataset.ws === 'closed'")
    # An import that lists only the first rack's hosts empties the second: it is removed.
    hosts = [n.hostname for n in Node.objects.filter(rack=kept).order_by("slot")]
    topology = Topology(
        source="test",
        domains=[
            DesiredDomain(
                name=kept.name, external_id="", nodes=[DesiredNode(hostname=h, gpus=4) for h in hosts]
            )
        ],
    )
    in_thread(import_topology, operator, topology, allow_shrink=True)
    assert not Rack.objects.filter(pk=removed.pk).exists()

    server.start()
    page.wait_for_function(f"window.__removed.includes({removed.pk})", timeout=20000)
    assert page.evaluate(f"window.rackwise.cellState({gone_node.pk}, 0)") is None
    # The Fleet page drops its card and overview square too.
    page.wait_for_function(
        f"!document.querySelector('article.rack[data-rack-id=\"{removed.pk}\"]') && "
        f"!document.querySelector('[data-ov=\"{removed.pk}\"]')"
    )
    assert page.evaluate(f"window.rackwise.live.racks.has({kept.pk})")
    assert any(q.startswith("since=") for q in fetched)


def test_a_gap_in_versions_makes_the_page_refetch_the_rack(page, fleet, operator):
    rack = fleet[0]
    log_in_as(page, operator)
    open_live(page)
    seen = rack_version(page, rack.pk)
    snapshots = page.evaluate("window.rackwise.snapshots")
    # A message from the future (as if two were dropped): applied, and the rack re-fetched.
    page.evaluate(f"""() => {{
      const r = structuredClone(window.rackwise.live.racks.get({rack.pk}));
      r.version = {seen} + 3;
      window.rackwise.live.apply(r);
    }}""")
    page.wait_for_function(f"window.rackwise.gaps === 1 && window.rackwise.snapshots > {snapshots}")
