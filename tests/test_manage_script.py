"""scripts/manage runs manage.py with scripts/run's settings in a new shell (no
DEBUG or SECRET_KEY exported), and the README's token example works as pasted."""

from __future__ import annotations

import os
import subprocess

import pytest
from django.db import connection

from tests.test_settings import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

# The README's example, word for word (the URL is the test server's).
README_EXAMPLE = """
TOKEN=$(scripts/manage create_api_user ci-bot --role submitter --tenant llm)
curl -s -H "Authorization: Token $TOKEN" "$RACKWISE_URL/api/me/"
"""


def _new_shell_env(tmp_path, **extra: str) -> dict[str, str]:
    """A shell that has not been through scripts/run: no DEBUG, no SECRET_KEY."""
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "SECRET_KEY", "SECRET_KEY_FILE")}
    s = connection.settings_dict
    env |= {
        "DATABASE_URL": f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}",
        "RACKWISE_VAR_DIR": str(tmp_path),
    }
    return env | extra


def test_the_readme_token_example_works_when_pasted(live_server, fleet, tmp_path):
    result = subprocess.run(
        ["bash", "-c", README_EXAMPLE],
        cwd=ROOT,
        env=_new_shell_env(tmp_path, RACKWISE_URL=live_server.url),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '{"username":"ci-bot","role":"submitter","tenants":["llm"]}'


def test_manage_works_without_debug_or_secret_key_exported(fleet, tmp_path):
    result = subprocess.run(
        ["scripts/manage", "create_api_user", "bot", "--role", "viewer"],
        cwd=ROOT,
        env=_new_shell_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) == 64 and "SECRET_KEY" not in result.stderr


def test_a_submitter_without_a_tenant_is_refused_in_one_line(fleet, tmp_path):
    from django.contrib.auth import get_user_model

    result = subprocess.run(
        ["scripts/manage", "create_api_user", "lonely", "--role", "submitter"],
        cwd=ROOT,
        env=_new_shell_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "a submitter must belong to a tenant" in lines[0], result.stderr
    assert result.stdout == ""
    assert not get_user_model().objects.filter(username="lonely").exists()
