"""Strict configuration: a bad environment value stops ``manage.py`` with exit
status 2 and one line naming the variable, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Variables the settings read; each test starts from a known-good set of them.
SETTINGS_VARS = (
    "DEBUG",
    "SECRET_KEY",
    "DATABASE_URL",
    "REDIS_URL",
    "CSRF_TRUSTED_ORIGINS",
    "ALLOWED_HOSTS",
    "RACKWISE_VAR_DIR",
    "LOG_LEVEL",
)


def manage(*args: str, unset: tuple[str, ...] = (), **overrides: str) -> subprocess.CompletedProcess:
    env = os.environ.copy()
    for name in SETTINGS_VARS:
        env.pop(f"{name}_FILE", None)
    env.update(
        DJANGO_SETTINGS_MODULE="rackwise.settings",
        DEBUG="0",
        SECRET_KEY="test-secret",
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/rackwise",
        REDIS_URL="redis://127.0.0.1:6379/0",
        ALLOWED_HOSTS="localhost",
    )
    env.pop("CSRF_TRUSTED_ORIGINS", None)
    for name in unset:
        env.pop(name, None)
    env.update(overrides)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("configuration error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in result.stderr + result.stdout


def test_a_good_environment_passes_the_system_check():
    result = manage("check")

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("DEBUG", "maybe", ("DEBUG='maybe'", "is not a boolean; use one of 1/0, true/false, yes/no, on/off")),
        (
            "DATABASE_URL",
            "mysql://x",
            ("DATABASE_URL='mysql://x'", "must be a URL starting with", "postgres://"),
        ),
        ("REDIS_URL", "http://x", ("REDIS_URL='http://x'", "must be a URL starting with", "redis://")),
        (
            "CSRF_TRUSTED_ORIGINS",
            "example.com",
            ("CSRF_TRUSTED_ORIGINS entry 'example.com'", "https://example.com"),
        ),
    ],
)
def test_a_bad_value_stops_start_up_with_one_line_naming_the_variable(name, value, says):
    result = manage("check", **{name: value})

    assert_one_line_error(result, *says)


def test_debug_off_without_a_secret_key_stops_start_up():
    result = manage("check", unset=("SECRET_KEY",), DEBUG="0")

    assert_one_line_error(result, "SECRET_KEY is required when DEBUG is off", "SECRET_KEY_FILE")


def test_an_empty_secret_key_counts_as_missing():
    result = manage("check", SECRET_KEY="", DEBUG="0")

    assert_one_line_error(result, "SECRET_KEY is required")


def test_the_secret_key_can_come_from_a_file(tmp_path):
    key_file = tmp_path / "secret"
    key_file.write_text("from-a-mounted-file\n")

    result = manage(
        "shell",
        "-c",
        "from django.conf import settings; print(settings.SECRET_KEY)",
        unset=("SECRET_KEY",),
        SECRET_KEY_FILE=str(key_file),
    )

    assert result.returncode == 0, result.stderr
    assert last_line(result.stdout) == "from-a-mounted-file"
    assert manage("check", unset=("SECRET_KEY",), SECRET_KEY_FILE=str(key_file)).returncode == 0


def test_an_unreadable_secret_key_file_names_the_variable(tmp_path):
    result = manage("check", unset=("SECRET_KEY",), SECRET_KEY_FILE=str(tmp_path / "missing"))

    assert_one_line_error(result, "SECRET_KEY_FILE=", "cannot be read")


def test_debug_on_without_a_secret_key_generates_and_keeps_one(tmp_path):
    code = "from django.conf import settings; print(settings.SECRET_KEY)"
    overrides = {"DEBUG": "1", "RACKWISE_VAR_DIR": str(tmp_path)}

    first = manage("shell", "-c", code, unset=("SECRET_KEY",), **overrides)
    second = manage("shell", "-c", code, unset=("SECRET_KEY",), **overrides)

    assert first.returncode == 0, first.stderr
    key = (tmp_path / "secret_key").read_text().strip()
    assert len(key) >= 40
    assert last_line(first.stdout) == last_line(second.stdout) == key
