"""The Fleet page's frame: racks grouped by site and row, open for a small
fleet, collapsed (cards in a <template>) above FleetView.open_limit racks."""

from __future__ import annotations

import re

import pytest

from fleet.services.nodes.inventory import create_rack
from fleet.views import FleetView


@pytest.fixture
def page_as_viewer(client, viewer):
    client.force_login(viewer)
    return lambda: client.get("/").content.decode()


def test_a_small_fleet_shows_its_groups_open_with_the_cards_in_the_document(page_as_viewer, fleet):
    create_rack(None, name="b1", site="dc", row="B", position=1)
    html = page_as_viewer()
    assert re.findall(r'data-testid="group" data-site="([^"]*)" data-row="([^"]*)"', html) == [
        ("dc", "A"),
        ("dc", "B"),
    ]
    assert html.count('aria-expanded="true"') == 2 and "<template>" not in html
    assert html.count('data-testid="rack"') == 3


def test_a_large_fleet_starts_collapsed_with_each_group_counting_its_racks_and_gpus(page_as_viewer, db):
    n = FleetView.open_limit + 2
    for i in range(n):
        create_rack(None, name=f"x{i:02d}", site="dc", row="AB"[i % 2], position=i)
    html = page_as_viewer()
    assert html.count('aria-expanded="false"') == 2 and 'aria-expanded="true"' not in html
    assert html.count("<template>") == 2 and html.count('data-testid="rack"') == n
    # Each group's header: its racks, and its GPUs (the used count comes live).
    assert re.findall(r'data-agg="racks">(\d+)<', html) == [str(n // 2)] * 2
    assert re.findall(r'data-agg="total">(\d+)<', html) == [str(n // 2 * 72)] * 2
    # The overview map is one tab stop.
    assert html.count("data-ov=") == n and len(re.findall(r'data-ov="\d+" tabindex="0"', html)) == 1
