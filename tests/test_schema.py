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
    for path in (
        "/api/jobs/",
        "/api/jobs/{id}/cancel/",
        "/api/racks/{id}/",
        "/api/nodes/{id}/drain/",
        "/api/fleet/summary/",
    ):
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


def _operations(schema: dict):
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            yield path, method.upper(), op


def test_every_operation_declares_the_errors_it_can_answer(operator_client):
    schema = operator_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    ref = {"$ref": "#/components/schemas/Error"}
    for path, method, op in _operations(schema):
        codes = op["responses"]
        assert {"403", "429", "503"} <= set(codes), (method, path)
        if method in ("POST", "PUT", "PATCH", "DELETE"):
            assert {"400", "409"} <= set(codes), (method, path)
        if "{" in path:
            assert "404" in codes, (method, path)
        if path != "/api/actions/{id}/callback/":  # HMAC-signed, no login
            assert codes["401"]["content"]["application/json"]["schema"] == ref, (method, path)
    assert schema["components"]["schemas"]["Error"]["required"] == ["detail"]
    assert "400" in schema["paths"]["/api/jobs/"]["get"]["responses"]  # filters and limit
    assert "409" in schema["paths"]["/api/jobs/{id}/export/"]["get"]["responses"]


def test_a_job_submission_s_schema_refuses_unknown_fields_as_the_api_does(operator_client):
    schemas = operator_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()["components"][
        "schemas"
    ]
    assert schemas["JobSubmitRequest"]["additionalProperties"] is False
    assert schemas["SlurmSpecRequest"]["additionalProperties"] is False


def test_the_declared_error_shapes_are_the_ones_sent(fleet, submitter_client, viewer_client):
    bad = submitter_client.post("/api/jobs/", {"name": "j", "num_gpus": 0}, format="json")
    assert bad.status_code == 400 and all(isinstance(v, list) for v in bad.json().values())
    refused = viewer_client.post("/api/jobs/", {"name": "j", "num_gpus": 4}, format="json")
    assert refused.status_code == 403 and set(refused.json()) == {"detail"}
    missing = viewer_client.get("/api/jobs/999999/")
    assert missing.status_code == 404 and set(missing.json()) == {"detail"}
