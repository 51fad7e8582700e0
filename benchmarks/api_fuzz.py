"""The full schemathesis run of the API: every operation with 200 generated
examples per mode (valid and invalid, generated and real ids), the schema's own
examples, and 200 stateful chains, as an operator and as a submitter, through
the real app on a test database. Prints, per persona, the requests by status
class and by (status, operation); exits non-zero if any answer was a 5xx or did
not match the schema. The suite runs the same tests with 20 examples
(tests/test_api_fuzz.py).

    .venv/bin/python benchmarks/api_fuzz.py [--examples 200] [--chains 200]

Needs what ./scripts/test needs (PostgreSQL, Redis): run it with the same
environment, e.g. after ./scripts/test once, or under scripts/test's settings:
DATABASE_URL, REDIS_URL.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=200, help="examples per operation and mode (200)")
    parser.add_argument("--chains", type=int, default=200, help="stateful chains per persona (200)")
    args = parser.parse_args()
    env = {
        "DEBUG": "0",
        "SECRET_KEY": "insecure-fuzz-key",
        "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
        "SECURE_SSL_REDIRECT": "0",
        "SESSION_COOKIE_SECURE": "0",
        "CSRF_COOKIE_SECURE": "0",
        "LOG_LEVEL": "ERROR",
        **os.environ,
        "RACKWISE_FUZZ_EXAMPLES": str(args.examples),
        "RACKWISE_FUZZ_STATEFUL_EXAMPLES": str(args.chains),
    }
    command = [
        sys.executable,
        "-m",
        "pytest",
        "tests/test_api_fuzz.py",
        "-s",
        "-q",
        "-p",
        "no:cacheprovider",
        "--no-header",
    ]
    return subprocess.run(command, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
