"""Where the hardware's health shows (issue #31): the rack page's node health
(latest values, a sparkline of the last hour, the verdicts in force with their
reasons) from ``GET /api/racks/<id>/signals/`` and the page itself, and the
rack health the Fleet page's cards and the kiosk draw from the live feed
(fabric degraded and by which nodes, GPUs with verdicts)."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.choices import NodeState
from fleet.events import rack_state
from fleet.models import Node, Rack
from fleet.services.intake import health
from fleet.services.read.signals import rack_signals
from fleet.sparkline import sparkline
from tests.signals_support import signals_beat
from tests.test_heartbeats import agent_client, post_beat

pytestmark = pytest.mark.django_db


@pytest.fixture
def beat(fleet, django_capture_on_commit_callbacks):
    """beat(hostname, imex=..., **signal changes): that node's agent reports, and
    what it sets off on commit (the rack's fabric judged) runs."""

    def send(hostname: str, imex: str = "ready", **changes) -> dict:
        node = Node.objects.get(hostname=hostname)
        payload = signals_beat(**changes)
        payload["imex"] = {"status": imex, "detail": "" if imex == "ready" else "no quorum"}
        client = agent_client(health.issue_agent_token(None, node.pk))
        with django_capture_on_commit_callbacks(execute=True):
            response = post_beat(client, node, payload)
        assert response.status_code == 200, response.content
        return response.json()

    return send


@pytest.fixture
def rising_ecc(beat, clock, default_health_rules):
    """r1-n00 for 31 minutes: corrected ECC errors rise 100 on each GPU (~194/h,
    over the default rule's 100/h: drain), a sample a minute on the way;
    r1-n01 reports a hardware thermal slowdown (suspect)."""
    for minute in range(32):
        clock.at = minute
        beat("r1-n00", ecc__volatile_corrected=100 * minute // 31)
    beat("r1-n01", clock_event_reasons=["hw_thermal_slowdown"])


def _node(body: dict, hostname: str) -> dict:
    return next(n for n in body["nodes"] if n["hostname"] == hostname)


def test_the_api_gives_each_nodes_latest_signals_rates_and_verdicts(rising_ecc, viewer_client):
    r1 = Rack.objects.get(name="r1")
    response = viewer_client.get(f"/api/racks/{r1.pk}/signals/")
    assert response.status_code == 200
    body = response.json()
    assert [n["slot"] for n in body["nodes"]] == list(range(18))
    assert body["fabric_degraded"] == "" and body["verdicts"] == {"drain": 4, "suspect": 4}

    n00 = _node(body, "r1-n00")
    # temperature_c is 40 + the GPU's index; 80.7 W each.
    assert n00["hottest"] == {"gpu": 3, "temperature_c": 43.0}
    assert n00["power_w"] == pytest.approx(4 * 80.7)
    assert n00["gpus_reporting"] == 4
    assert n00["clock_events"] == [{"reason": "gpu_idle", "gpus": [0, 1, 2, 3], "quiet": True}]
    # Only what rose; the lifetime twin of a volatile counter is left out.
    [ecc] = n00["rising"]
    assert ecc["counter"] == "ecc.volatile_corrected" and ecc["window"] == "1h"
    assert ecc["gpus"] == [0, 1, 2, 3] and ecc["per_hour"] == pytest.approx(4 * 100 * 60 / 31, rel=0.01)
    assert n00["fabric"] == {"imex_status": "ready", "imex_detail": "", "clique_id": 7, "trouble": ""}
    # The rule's verdict on each GPU, with its reason; the node drains because of it.
    [drain] = n00["verdicts"]
    assert drain["verdict"] == "drain" and drain["gpus"] == [0, 1, 2, 3], "one reason, one line"
    assert "rule corrected-ecc-rising" in drain["reason"]
    assert n00["state"] == NodeState.DRAINED and n00["drained_by_rule"] is True, "no jobs: drained at once"
    assert n00["gpus_unwell"] == [], "GPUs a verdict made unwell are listed once, with the verdict"
    # The last hour, a point a minute: the hottest GPU and the node's power.
    assert len(n00["samples"]) == 32
    assert all(p[1] == 43.0 and p[2] == pytest.approx(322.8) for p in n00["samples"])

    n01 = _node(body, "r1-n01")
    assert n01["clock_events"] == [{"reason": "hw_thermal_slowdown", "gpus": [0, 1, 2, 3], "quiet": False}]
    assert n01["rising"] == [] and n01["state"] == NodeState.HEALTHY
    assert n01["verdicts"] == [
        {
            "verdict": "suspect",
            "reason": "clock_event_reasons.hw_thermal_slowdown is set (rule hw-thermal-slowdown)",
            "gpus": [0, 1, 2, 3],
        }
    ]

    silent = _node(body, "r1-n02")
    assert silent["read_at"] is None and silent["hottest"] is None and silent["samples"] == []
    assert silent["verdicts"] == [] and silent["fabric"] is None


def test_a_racks_summary_is_four_queries_whatever_its_size(rising_ecc):
    r1 = Rack.objects.get(name="r1")
    with CaptureQueriesContext(connection) as queries:
        rack_signals(r1.pk)
    assert len(queries) == 4


def test_every_persona_with_a_role_reads_it_and_an_unknown_rack_is_a_404(
    fleet, viewer_client, submitter_client, outsider_client, anon_client
):
    r1 = fleet[0]
    assert submitter_client.get(f"/api/racks/{r1.pk}/signals/").status_code == 200
    assert outsider_client.get(f"/api/racks/{r1.pk}/signals/").status_code == 403
    assert anon_client.get(f"/api/racks/{r1.pk}/signals/").status_code == 401
    assert viewer_client.get("/api/racks/999999/signals/").status_code == 404


def _page(client, rack: Rack, path: str = "") -> str:
    response = client.get(f"/racks/{rack.pk}/{path}")
    assert response.status_code == 200
    return response.content.decode()


def _row(html: str, node: Node) -> str:
    match = re.search(rf'<tr data-testid="node-health-row" data-node-id="{node.pk}".*?</tr>', html, re.S)
    assert match, f"no health row for {node}"
    return match.group(0)


def test_the_rack_page_shows_each_nodes_health_with_a_sparkline_and_the_verdicts(rising_ecc, viewer, client):
    client.force_login(viewer)
    r1 = Rack.objects.get(name="r1")
    html = _page(client, r1)

    n00 = _row(html, Node.objects.get(hostname="r1-n00"))
    assert "43 °C" in n00 and "GPU 3" in n00 and "323 W" in n00
    # Two sparklines (temperature, power), 32 points each, drawn inline.
    assert n00.count('data-testid="sparkline"') == 2 and 'data-points="32"' in n00
    assert "hottest GPU, last hour: 43 to 43 °C" in n00
    assert "ECC corrected +" in n00 and "/h" in n00
    assert "GPUs 0, 1, 2, 3: drain" in n00 and "rule corrected-ecc-rising" in n00
    assert "drained</span> by a health rule" in n00 and "(health rule)" in n00, "the reason in its title"

    n01 = _row(html, Node.objects.get(hostname="r1-n01"))
    assert "hw thermal slowdown" in n01 and "GPUs 0, 1, 2, 3: suspect" in n01

    silent = _row(html, Node.objects.get(hostname="r1-n05"))
    assert "no agent readings" in silent and "sparkline" not in silent
    assert 'data-testid="rack-fabric-degraded"' not in html

    # The fragment the page refreshes itself from is the same table.
    fragment = _page(client, r1, "signals/")
    assert _row(fragment, Node.objects.get(hostname="r1-n00")).count('data-testid="sparkline"') == 2


def test_the_fragment_needs_a_role_and_a_rack(fleet, outsider, viewer, client):
    client.force_login(outsider)
    assert client.get(f"/racks/{fleet[0].pk}/signals/").status_code == 403
    client.force_login(viewer)
    assert client.get("/racks/999999/signals/").status_code == 404


def test_a_degraded_rack_carries_its_badge_on_the_rack_page_the_fleet_page_and_the_live_feed(
    beat, viewer, client
):
    beat("r1-n00", imex="unavailable")
    beat("r1-n01", fabric__health_mask=2)
    r1, r2 = Rack.objects.get(name="r1"), Rack.objects.get(name="r2")
    assert r1.fabric_degraded.startswith("NVLink fabric degraded on 2 of 18 nodes")

    # The live feed and the console snapshot: why, and which nodes report now.
    state = {s["rack"]: s for s in rack_state([r1.pk, r2.pk])}
    assert state[r1.pk]["fabric_degraded"] == r1.fabric_degraded
    assert state[r1.pk]["fabric_nodes"] == ["r1-n00", "r1-n01"]
    assert state[r1.pk]["verdicts"] == {"suspect": 4}, "the fabric-health rule on r1-n01's GPUs"
    assert (state[r2.pk]["fabric_degraded"], state[r2.pk]["fabric_nodes"], state[r2.pk]["verdicts"]) == (
        "",
        [],
        {},
    )

    client.force_login(viewer)
    snapshot = client.get("/api/console/racks/").json()
    nodes = {r["rack"]: r["fabric_nodes"] for r in snapshot["racks"]}
    assert nodes == {r1.pk: ["r1-n00", "r1-n01"], r2.pk: []}

    html = _page(client, r1)
    assert 'data-testid="rack-fabric-degraded"' in html and "r1-n00: IMEX unavailable (no quorum)" in html
    assert "GPU 0 fabric health mask 0x2" in _row(html, Node.objects.get(hostname="r1-n01"))

    fleet_page = client.get("/").content.decode()
    badges = re.findall(
        r'<a class="badge fabric-degraded"[^>]*data-testid="rack-fabric-badge"[^>]*>', fleet_page
    )
    assert len(badges) == 2
    shown = [b for b in badges if " hidden" not in b]
    assert len(shown) == 1 and "NVLink fabric degraded on 2 of 18 nodes" in shown[0]


def test_a_sparkline_follows_its_points_and_breaks_where_a_value_is_missing():
    points = [[0, 40.0, 100.0], [60, 50.0, None], [120, None, 120.0], [180, 45.0, 130.0]]
    svg = sparkline(points, 1, label="t", unit="C")
    path = re.search(r'<path d="([^"]*)"', svg).group(1)
    assert [p[0] for p in path.split()] == ["M", "L", "M"], "a missing value starts a new piece"
    ys = [float(p.split(",")[1]) for p in path.split()]
    assert ys[1] < ys[2] < ys[0], "hotter is higher"
    assert 'data-points="3"' in svg and "t, last hour: 40 to 50 C, now 45 C" in svg
    assert sparkline([[0, None, None]], 1, label="t", unit="C") == ""
