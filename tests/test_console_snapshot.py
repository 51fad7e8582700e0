"""The console's first load, GET /api/console/racks/, is gzipped for clients that
accept it (the whole fleet's cells), and the same JSON either way."""

from __future__ import annotations

import gzip
import json


def test_the_snapshot_is_gzipped_when_accepted_and_the_same_json(fleet, viewer_client):
    plain = viewer_client.get("/api/console/racks/")
    zipped = viewer_client.get("/api/console/racks/", headers={"accept-encoding": "gzip"})

    assert plain.status_code == zipped.status_code == 200
    assert "Content-Encoding" not in plain
    assert zipped["Content-Encoding"] == "gzip" and "Accept-Encoding" in zipped["Vary"]
    body = gzip.decompress(zipped.content)
    assert json.loads(body) == plain.json()
    assert len(zipped.content) * 5 < len(body), "cells compress well"


def test_pages_are_not_gzipped(fleet, viewer_client):
    """A page carries a CSRF token: compressed, it would be open to BREACH."""
    assert "Content-Encoding" not in viewer_client.get("/", headers={"accept-encoding": "gzip"})
