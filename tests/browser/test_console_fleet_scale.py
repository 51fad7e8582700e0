"""The Fleet page at scale and on a wall: racks grouped by site and row and
collapsed to live aggregates, a rack-name search, filters and density in the
URL, the overview map as one tab stop, a kiosk mode that fills a 4K screen, and
a layout for a 390 px phone."""

from __future__ import annotations

import pytest

from fleet import read_cache
from fleet.models import Node
from fleet.services.nodes.inventory import create_rack
from fleet.services.nodes.moves import mark_node_failed
from tests.browser.helpers import grid_cells, in_thread, log_in_as, open_live, post_api

pytestmark = pytest.mark.browser


@pytest.fixture
def big_fleet(db):
    """60 NVL72 racks: sites east and west, rows A to C, 10 racks a row (east-A01 ...)."""
    racks = [
        create_rack(None, name=f"{site}-{row}{pos:02d}", site=site, row=row, position=pos)
        for site in ("east", "west")
        for row in "ABC"
        for pos in range(1, 11)
    ]
    # create_rack moves the read models' generation on commit, and this fixture's
    # transaction is not the app server's: move it now, or the server could serve
    # the fragmentation report (the groups' slices) of the previous test's fleet.
    read_cache.bump()
    return racks


def _group(page, site, row):
    return page.locator(f"[data-testid=group][data-site='{site}'][data-row='{row}']")


def _agg(group, key):
    return group.locator(f"[data-agg={key}]").text_content()


def test_a_large_fleet_is_grouped_collapsed_to_live_aggregates_and_a_rack_name_search_opens_its_group(
    page, big_fleet, operator
):
    log_in_as(page, operator)
    open_live(page)
    assert page.locator("[data-testid=group]").count() == 6
    assert (
        page.eval_on_selector_all(
            "[data-testid=group-toggle]", "bs => bs.map(b => b.getAttribute('aria-expanded'))"
        )
        == ["false"] * 6
    )
    assert (
        page.evaluate("document.querySelectorAll('article.rack').length") == 0
    )  # parsed, not in the document
    east_a = _group(page, "east", "A")
    # 10 racks of 18 nodes (2 spares each): 180 free nodes, a largest free slice of 16.
    assert [_agg(east_a, k) for k in ("racks", "used", "total", "free", "slice", "failed", "draining")] == [
        "10",
        "0",
        "720",
        "180",
        "16",
        "0",
        "0",
    ]

    # The keyboard opens a group; its racks are drawn.
    east_a.locator("[data-testid=group-toggle]").focus()
    page.keyboard.press("Enter")
    assert east_a.locator("[data-testid=group-toggle]").get_attribute("aria-expanded") == "true"
    assert east_a.locator("article.rack").count() == 10
    page.wait_for_function("document.querySelectorAll('article.rack[data-painted]').length >= 10")
    first = east_a.locator("article.rack").first.get_attribute("data-rack-id")
    cells = grid_cells(page, f"article.rack[data-rack-id='{first}']")
    assert len(cells) == 72 and all(c["fill"] == "free" for c in cells)

    # A node fails in a collapsed group: its header counts it, live.
    west_b = _group(page, "west", "B")
    node = Node.objects.get(rack__name="west-B03", slot=7)
    status, body = post_api(page, f"/api/nodes/{node.pk}/mark-failed/", {"reason": "XID 79"})
    assert status == 200, body
    page.wait_for_function(
        """() => document.querySelector("[data-testid=group][data-site=west][data-row=B] """
        """[data-agg=failed]").textContent === '1'"""
    )
    assert (_agg(west_b, "free"), _agg(west_b, "slice")) == ("179", "16")
    assert "bad" in west_b.locator("[data-agg-box=failed]").get_attribute("class")

    # A rack-name search shows that rack and opens its group.
    page.fill("[data-testid=search]", "west-C07")
    west_c = _group(page, "west", "C")
    assert west_c.locator("[data-testid=group-toggle]").get_attribute("aria-expanded") == "true"
    assert page.text_content("[data-testid=shown]") == "1"
    assert west_c.locator("article.rack:visible").count() == 1
    assert west_c.locator("article.rack:visible header a").text_content() == "west-C07"
    assert page.locator("[data-testid=group]:visible").count() == 1
    assert page.locator("[aria-expanded=true]").count() == 1  # the others stay collapsed, east/A too
    assert page.js_errors == []


def test_filters_and_density_survive_a_reload_through_the_url(page, big_fleet, viewer):
    failed = Node.objects.get(rack__name="east-B04", slot=2)
    in_thread(mark_node_failed, None, failed.pk, "XID 48")
    log_in_as(page, viewer)
    # The attention banner's link: racks with failed nodes, their groups open.
    open_live(page, "/?state=failed")
    assert page.locator("[name=state]").input_value() == "failed"
    assert page.text_content("[data-testid=shown]") == "1"
    visible = page.locator("article.rack:visible")
    assert visible.count() == 1 and visible.get_attribute("data-name") == "east-B04"

    page.select_option("[name=state]", "")
    page.select_option("[name=site]", "west")
    page.select_option("[name=row]", "B")
    page.select_option("[data-testid=sort]", "slice")
    page.select_option("[data-testid=density]", "tiny")
    assert page.url.endswith("/?site=west&row=B&sort=slice&density=tiny")
    page.reload()
    page.wait_for_function("document.body.dataset.ws === 'open' && document.body.dataset.ready === '1'")
    values = [page.locator(f"[name={n}]").input_value() for n in ("site", "row", "sort", "density", "state")]
    assert values == ["west", "B", "slice", "tiny", ""]
    assert page.text_content("[data-testid=shown]") == "10"
    assert (
        _group(page, "west", "B").locator("[data-testid=group-toggle]").get_attribute("aria-expanded")
        == "true"
    )
    # Tiny: 4 px cells (and a 1 px gap), 4 GPUs wide.
    page.wait_for_function("document.querySelectorAll('article.rack[data-painted-cell=\"4\"]').length === 10")
    assert page.locator("article.rack:visible .grid svg").first.get_attribute("width") == "20"
    assert page.js_errors == []


def test_the_overview_map_is_one_tab_stop_and_arrow_keys_move_inside_it(page, big_fleet, viewer):
    log_in_as(page, viewer)
    page.set_viewport_size({"width": 700, "height": 900})  # the map wraps: up and down have somewhere to go
    open_live(page)
    squares = page.locator("[data-testid=overview] [data-ov]")
    assert squares.count() == 60
    assert (
        page.evaluate("[...document.querySelectorAll('[data-ov]')].filter(b => b.tabIndex >= 0).length") == 1
    )
    active = "document.activeElement.dataset.ov ? Number(document.activeElement.dataset.ov) : null"
    ids = [r.pk for r in big_fleet]

    page.locator("[data-testid=density]").focus()
    page.keyboard.press("Tab")
    assert page.evaluate(active) == ids[0]
    page.keyboard.press("ArrowRight")
    assert page.evaluate(active) == ids[1]
    cols = page.evaluate(
        "(() => { const b = [...document.querySelectorAll('[data-ov]')]; "
        "return b.filter(x => x.offsetTop === b[0].offsetTop).length; })()"
    )
    assert 1 < cols < 60
    page.keyboard.press("ArrowDown")
    assert page.evaluate(active) == ids[1 + cols]
    page.keyboard.press("ArrowLeft")
    assert page.evaluate(active) == ids[cols]
    page.keyboard.press("ArrowUp")
    assert page.evaluate(active) == ids[0]
    page.keyboard.press("End")
    assert page.evaluate(active) == ids[-1]
    # One stop: Tab leaves the map, Shift+Tab comes back to the same square.
    page.keyboard.press("Tab")
    assert page.evaluate(active) is None
    page.keyboard.press("Shift+Tab")
    assert page.evaluate(active) == ids[-1]
    # Enter goes to the rack: its group opens and its grid has the focus.
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.closest('article.rack').dataset.name") == "west-C10"
    assert (
        _group(page, "west", "C").locator("[data-testid=group-toggle]").get_attribute("aria-expanded")
        == "true"
    )
    assert page.js_errors == []


def test_kiosk_fills_a_4k_screen_with_eight_live_racks_and_a_phone_never_scrolls_sideways(page, operator):
    racks = [create_rack(None, name=f"k{i}", site="dc", row="A", position=i) for i in range(1, 9)]
    log_in_as(page, operator)
    page.set_viewport_size({"width": 3840, "height": 2160})
    open_live(page, "/?kiosk=1")
    assert page.evaluate("document.body.classList.contains('kiosk')")
    assert page.locator(".topbar").is_hidden() and page.locator("[data-testid=filters]").is_hidden()
    # Fitted again once the totals are in (they take room above the racks), and drawn at that size.
    page.wait_for_function("""() => {
      const groups = document.querySelector('[data-testid=groups]');
      return document.querySelector('[data-total=fragmentation]').textContent !== '…' \
&& !groups.dataset.fitting
        && [...document.querySelectorAll('article.rack')].every(el => \
el.dataset.paintedCell === groups.dataset.cell);
    }""")
    cover = page.evaluate("""() => {
      const area = [...document.querySelectorAll('article.rack .grid svg')].map(el => \
el.getBoundingClientRect())
        .reduce((sum, r) => sum + r.width * r.height, 0);
      const root = document.scrollingElement;
      return { share: area / (innerWidth * innerHeight), \
scrolls: root.scrollHeight > innerHeight || root.scrollWidth > innerWidth };
    }""")
    assert cover["share"] >= 0.5 and not cover["scrolls"], cover

    # Still live: a failed node shows on the wall.
    node = Node.objects.get(rack=racks[3], slot=5)
    status, body = post_api(page, f"/api/nodes/{node.pk}/mark-failed/", {"reason": "XID 79"})
    assert status == 200, body
    page.wait_for_function(
        "node => window.rackwiseGrid.cells('main').filter(c => c.node === node"
        " && c.state === 'failed' && c.pattern === 'p-failed' && c.letter === 'F').length === 4",
        arg=node.pk,
    )

    page.set_viewport_size({"width": 390, "height": 844})
    open_live(page)
    assert page.locator(".topbar").is_visible()
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 390
    assert page.js_errors == []
