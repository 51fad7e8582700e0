"""A node fails under a running job: the page shows it failed, and the job's new
cell (the spare swapped in) appears."""

from __future__ import annotations

import pytest

from fleet.models import Node
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from tests.browser.helpers import hover_cell, log_in_as, open_live, post_api

pytestmark = pytest.mark.browser


def test_a_failed_node_shows_as_failed_and_the_recovered_jobs_new_cell_appears(
    page, fleet, operator, submitter, worker
):
    rack = fleet[0]
    nodes = list(Node.objects.filter(rack=rack).order_by("slot")[:2])
    job = submit_job(
        submitter,
        JobSpec(name="train", num_nodes=2, gpus_per_node=4, tenant="llm", expected_duration_s=10**6),
    )
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
    start_job(None, job.pk)

    log_in_as(page, operator)
    open_live(page)
    page.wait_for_function(f"window.rackwiseGrid.cells('main').filter(c => c.fill === {job.pk}).length === 8")
    failed = nodes[1]

    status, body = post_api(
        page, f"/api/nodes/{failed.pk}/mark-failed/", {"reason": "XID 79", "confirm": True}
    )
    assert status == 200, body

    page.wait_for_function(
        f"""() => {{
          const cells = window.rackwise.jobCells({job.pk});
          const onFailed = cells.filter(c => c.node === {failed.pk}).length;
          const drawn = window.rackwiseGrid.cells('main');
          const dom = drawn.filter(c => c.fill === {job.pk}).length;
          const marked = drawn.filter(c => c.node === {failed.pk} && c.state === 'failed' && \
c.pattern === 'p-failed' && c.letter === 'F').length;
          return cells.length === 8 && onFailed === 0 && dom === 8 && marked === 4;
        }}""",
        timeout=30000,
    )
    cells = page.evaluate(f"window.rackwise.jobCells({job.pk})")
    new_nodes = {c["node"] for c in cells} - {n.pk for n in nodes}
    assert len(new_nodes) == 1 and all(c["rack"] == rack.pk for c in cells)  # swapped in place
    title = hover_cell(page, f"article.rack[data-rack-id='{rack.pk}']", failed.pk, 0)
    assert f"{failed.hostname} GPU 0" in title and "node failed" in title
