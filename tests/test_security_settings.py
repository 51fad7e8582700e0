"""HTTPS settings (on by default when DEBUG is off, each overridable), and error
pages that hide the password inside URL settings such as REDIS_URL."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.test import RequestFactory
from django.views.debug import ExceptionReporter, get_default_exception_reporter_filter

from tests.test_settings import ROOT

SHOW = (
    "import json; from django.conf import settings as s; print(json.dumps({k: getattr(s, k) for k in "
    "['SECURE_SSL_REDIRECT', 'SECURE_HSTS_SECONDS', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', "
    "'SECURE_PROXY_SSL_HEADER']}))"
)
SECURITY_VARS = (
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_PROXY_SSL_HEADER",
)


def _settings(**env: str) -> dict:
    import os

    base = {k: v for k, v in os.environ.items() if k not in SECURITY_VARS}
    base |= {"SECRET_KEY": "test-secret", "ALLOWED_HOSTS": "localhost"} | env
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", SHOW],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_https_settings_are_on_by_default_when_debug_is_off():
    assert _settings(DEBUG="0") == {
        "SECURE_SSL_REDIRECT": True,
        "SECURE_HSTS_SECONDS": 31536000,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_PROXY_SSL_HEADER": None,
    }


def test_https_settings_are_off_with_debug():
    got = _settings(DEBUG="1")
    assert not got["SECURE_SSL_REDIRECT"] and got["SECURE_HSTS_SECONDS"] == 0
    assert not got["SESSION_COOKIE_SECURE"] and not got["CSRF_COOKIE_SECURE"]


def test_each_https_setting_can_be_overridden_and_the_proxy_header_named():
    got = _settings(
        DEBUG="0",
        SECURE_SSL_REDIRECT="0",
        SECURE_HSTS_SECONDS="60",
        SESSION_COOKIE_SECURE="no",
        CSRF_COOKIE_SECURE="off",
        SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto",
    )
    assert got == {
        "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 60,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
    }


# Built, so that the test's own source (shown on the debug page) does not hold them.
REDIS_PASSWORD, BROKER_PASSWORD = "s3cret" + "-pw", "br0ker" + "-pw"


@pytest.fixture
def redis_with_password(settings):
    settings.REDIS_URL = f"redis://:{REDIS_PASSWORD}@redis.internal:6379/0"
    settings.CELERY_BROKER_URL = f"amqp://rabbit:{BROKER_PASSWORD}@mq.internal:5672//"
    settings.CHANNEL_LAYERS = {"default": {"CONFIG": {"hosts": [settings.REDIS_URL]}}}
    return settings


def test_error_pages_hide_the_password_inside_url_settings(redis_with_password):
    safe = get_default_exception_reporter_filter().get_safe_settings()

    assert safe["REDIS_URL"] == "redis://:********@redis.internal:6379/0"
    assert safe["CELERY_BROKER_URL"] == "amqp://rabbit:********@mq.internal:5672//"
    assert safe["CHANNEL_LAYERS"]["default"]["CONFIG"]["hosts"] == ["redis://:********@redis.internal:6379/0"]


def test_the_debug_page_shows_no_redis_or_broker_password(redis_with_password):
    request = RequestFactory().get("/")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        html = ExceptionReporter(request, *sys.exc_info()).get_traceback_html()

    assert "boom" in html
    assert "redis.internal" in html
    assert REDIS_PASSWORD not in html and BROKER_PASSWORD not in html


@pytest.mark.parametrize("path", ["/", "/jobs/", "/login/", "/api/docs/"])
def test_pages_send_a_content_security_policy_that_allows_no_foreign_or_inline_script(db, path, viewer):
    """Console pages sent no Content-Security-Policy (#28 item 16)."""
    from django.test import Client

    client = Client()
    if path != "/login/":
        client.force_login(viewer)
    response = client.get(path)
    assert response.status_code == 200
    policy = dict(
        [*part.strip().split(" ", 1), ""][:2]
        for part in response["Content-Security-Policy"].split(";")
        if part.strip()
    )
    assert policy["script-src"] == "'self'" and policy["default-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'" and policy["object-src"] == "'none'"


def test_no_template_has_an_inline_script_the_policy_would_block():
    import re

    for template in (ROOT / "templates").rglob("*.html"):
        for tag in re.findall(r"<script\b[^>]*>", template.read_text()):
            assert "src=" in tag or "application/json" in tag, f"{template.name}: inline {tag}"
