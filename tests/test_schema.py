"""The OpenAPI schema is valid and the docs page works without the internet."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_the_openapi_schema_validates_without_warnings(tmp_path):
    out = tmp_path / "schema.yml"
    result = subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn", "--file", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    schema = yaml.safe_load(out.read_text())
    assert schema["openapi"].startswith("3.")
    for path in ("/api/jobs/", "/api/jobs/{id}/cancel/", "/api/racks/{id}/", "/api/nodes/{id}/drain/", "/api/fleet/summary/"):
        assert path in schema["paths"], path


def test_the_docs_page_loads_its_assets_from_the_app(viewer_client):
    response = viewer_client.get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources, html[:500]
    for src in sources:
        assert not src.startswith(("http://", "https://", "//")), f"external asset {src}"
    assert any("swagger-ui" in src for src in sources)
