"""Server-rendered pages: a login everywhere, a role to see anything."""

from __future__ import annotations

import pytest
from django.test import Client

from fleet.services.users import ensure_user


@pytest.fixture
def browser(db):
    return Client()


def test_an_anonymous_visitor_is_sent_to_the_login_page(browser):
    response = browser.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=/")


def test_the_login_page_itself_is_open(browser):
    assert browser.get("/login/").status_code == 200


def test_every_page_has_an_icon_and_favicon_ico_finds_it(browser):
    # Browsers ask for /favicon.ico on a page that names no icon: it was a 404 in
    # the console of every first visit (the admin and the API docs name none).
    assert 'rel="icon" href="/static/rackwise/favicon.svg"' in browser.get("/login/").content.decode()
    response = browser.get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"] == "/static/rackwise/favicon.svg"


def test_a_viewer_logs_in_and_sees_the_fleet_and_its_role(browser, fleet):
    ensure_user(None, "vic", role="viewer", password="correct-horse")
    response = browser.post("/login/", {"username": "vic", "password": "correct-horse"})
    assert response.status_code == 302
    page = browser.get("/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "vic" in html and "Viewer" in html
    assert html.count('data-testid="rack"') == 2


def test_a_wrong_password_is_refused(browser, fleet):
    ensure_user(None, "vic", role="viewer", password="correct-horse")
    response = browser.post("/login/", {"username": "vic", "password": "wrong"})
    assert response.status_code == 200
    assert "didn't match" in response.content.decode()
    assert browser.get("/").status_code == 302


def test_an_outsider_without_a_role_is_refused(browser, outsider):
    browser.force_login(outsider)
    assert browser.get("/").status_code == 403


def test_logging_out_ends_the_session(browser, viewer):
    browser.force_login(viewer)
    assert browser.get("/").status_code == 200
    assert browser.post("/logout/").status_code == 302
    assert browser.get("/").status_code == 302


def test_the_admin_needs_staff(browser, viewer):
    browser.force_login(viewer)
    assert browser.get("/admin/").status_code == 302


def test_the_stylesheet_is_served_by_the_app(browser, viewer):
    browser.force_login(viewer)
    html = browser.get("/").content.decode()
    assert "http://" not in html.split("<body>")[0].replace("http://127.0.0.1", "")
    response = browser.get("/static/rackwise/rackwise.css")
    assert response.status_code == 200


@pytest.mark.parametrize("path", ["/jobs/", "/actions/", "/audit/", "/tenants/", "/racks/{rack}/"])
def test_every_console_page_needs_a_role(browser, outsider, fleet, path):
    browser.force_login(outsider)
    assert browser.get(path.format(rack=fleet[0].pk)).status_code == 403


@pytest.mark.parametrize("path", ["/jobs/", "/actions/", "/audit/", "/tenants/", "/racks/{rack}/"])
def test_a_viewer_reads_every_console_page(browser, viewer, fleet, path):
    browser.force_login(viewer)
    assert browser.get(path.format(rack=fleet[0].pk)).status_code == 200


def test_approve_and_reject_buttons_are_rendered_for_operators_only(browser, fragmented, viewer, operator):
    from fleet.services.decisions.defrag import plan_defrag

    action = plan_defrag(operator).action
    browser.force_login(viewer)
    html = browser.get("/actions/").content.decode()
    assert f'data-action-id="{action.pk}"' in html and 'data-testid="approve"' not in html
    browser.force_login(operator)
    html = browser.get("/actions/").content.decode()
    assert 'data-testid="approve"' in html and 'data-testid="reject"' in html


def test_a_pending_job_says_why_it_waits_in_words(browser, fragmented, viewer):
    _a, _b, waiting = fragmented
    browser.force_login(viewer)
    html = browser.get(f"/jobs/{waiting.pk}/").content.decode()
    assert "needs 16 nodes in one rack; the largest free slice is 14" in html


def test_a_running_jobs_grid_is_headed_by_its_racks_name(browser, fragmented, viewer):
    """The job page's grid had no rack name (#28 item 8)."""
    running, _b, _c = fragmented
    browser.force_login(viewer)
    html = browser.get(f"/jobs/{running.pk}/").content.decode()
    rack = running.allocations.first().gpu.node.rack
    assert f'<a href="/racks/{rack.pk}/" data-testid="job-rack-name">{rack.name}</a>' in html


def test_a_submitter_cannot_open_another_tenants_job(browser, fragmented, other_submitter):
    browser.force_login(other_submitter)
    assert browser.get(f"/jobs/{fragmented[0].pk}/").status_code == 404


def test_the_rack_page_names_the_spares_it_holds(browser, fleet, viewer):
    browser.force_login(viewer)
    html = browser.get(f"/racks/{fleet[0].pk}/").content.decode()
    assert '<p data-testid="spares">r1-n16, r1-n17</p>' in html


def test_the_console_snapshot_hides_other_tenants_job_names_from_a_submitter(
    fragmented, other_client, viewer_client
):
    a = fragmented[0]
    mine = viewer_client.get("/api/console/racks/").json()["racks"]
    theirs = other_client.get("/api/console/racks/").json()["racks"]
    assert mine[0]["jobs"][str(a.pk)]["name"] == "a"
    assert theirs[0]["jobs"][str(a.pk)]["name"] is None and theirs[0]["jobs"][str(a.pk)]["tenant"] is None
    assert [r["version"] for r in mine] == [r["version"] for r in theirs]


def test_the_chart_reads_recorded_samples(fleet, viewer_client):
    from fleet.services.read.metrics import record_sample

    record_sample()
    samples = viewer_client.get("/api/console/samples/?hours=6").json()["samples"]
    assert len(samples) == 1 and 0 <= samples[0]["utilization"] <= 1
