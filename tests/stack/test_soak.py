"""A soak of the whole stack, as users run it: the quick start's stack with the
demo workload, node failures marked through the API, defrag plans asked for, and
an operator client approving every proposal. Then the checks of
``benchmarks/soak.py`` (``Figures.failures``): invariants clean, no GPU ever held
twice, no job the fleet had room for left waiting, every approved action
finished or restored what it stopped, every expired proposal says why, no 5xx,
no traceback, one fragmentation figure. ``benchmarks/soak.py --minutes 30`` runs
the same for longer."""

from __future__ import annotations

import json
import os

from benchmarks.soak import Soak

MINUTES = float(os.environ.get("RACKWISE_SOAK_MINUTES", "4"))


def test_the_whole_stack_holds_its_invariants_under_a_soak(quickstart_stack):
    run = Soak(quickstart_stack, seed=27)
    figures = run.run(MINUTES)
    # Read while it runs: tests/stack/test_supervision.py uses the stack next,
    # and its Redis restart must not count against the soak.
    run.read_logs()

    print(json.dumps(figures.__dict__, indent=2))
    assert figures.failures() == []
    # It did something worth checking.
    assert figures.jobs_started >= 10 and figures.nodes_failed_by_soak >= 2 and figures.defrag_requests >= 3
