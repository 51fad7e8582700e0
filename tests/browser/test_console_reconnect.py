"""The page survives a cut websocket: it shows it is disconnected, reconnects by
itself, and repaints from the snapshot what it missed while away."""

from __future__ import annotations

import pytest

from fleet.models import Node, Rack
from fleet.services import nodes as node_services
from tests.browser.helpers import in_thread, log_in_as, open_live, rack_version

pytestmark = pytest.mark.browser


def test_the_page_recovers_after_the_websocket_is_cut(page, server, fleet, operator):
    rack = fleet[0]
    node = Node.objects.filter(rack=rack).order_by("slot").first()
    log_in_as(page, operator)
    open_live(page)
    seen = rack_version(page, rack.pk)

    server.stop()  # every socket drops; events sent meanwhile reach no one
    page.wait_for_function("document.body.dataset.ws === 'closed'")
    assert "disconnected" in page.text_content("[data-testid=ws-status]")
    in_thread(node_services.drain_node, operator, node.pk, "maintenance while the console is away")
    version = Rack.objects.get(pk=rack.pk).version
    assert version > seen

    server.start()
    page.wait_for_function(
        f"document.body.dataset.ws === 'open' && Number(document.querySelector('article.rack[data-rack-id=\"{rack.pk}\"]').dataset.version) >= {version}",
        timeout=20000,
    )
    assert page.evaluate(f"window.rackwise.cellState({node.pk}, 0).nodeState") == "draining" or page.evaluate(
        f"window.rackwise.cellState({node.pk}, 0).nodeState"
    ) == "drained"
    page.wait_for_function(f"document.querySelectorAll('g.cell[data-node=\"{node.pk}\"][data-state^=\"drain\"]').length === 4")


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
