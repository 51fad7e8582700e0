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


def test_a_viewer_logs_in_and_sees_the_fleet_and_its_role(browser, fleet):
    ensure_user(None, "vic", role="viewer", password="correct-horse")
    response = browser.post("/login/", {"username": "vic", "password": "correct-horse"})
    assert response.status_code == 302
    page = browser.get("/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "vic" in html and "Viewer" in html
    assert html.count('data-testid="rack-row"') == 2


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
