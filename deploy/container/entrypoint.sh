#!/bin/sh
# The image's one entry point: the first argument names the process.
#   web                     daphne on $PORT (8000)
#   worker QUEUES           a Celery worker for QUEUES (celery, scheduler, control,
#                           webhooks, or a comma-separated set), $CONCURRENCY processes
#   beat                    Celery beat: exactly one in the whole deployment
#   migrate                 python manage.py migrate, once per release
#   manage ARGS...          any management command (check_workers, createsuperuser, ...)
# Settings come from the environment (README, "Configuration").
set -eu
role="${1:-web}"
[ $# -gt 0 ] && shift
case "$role" in
  web)
    exec python -m daphne -b 0.0.0.0 -p "${PORT:-8000}" rackwise.asgi:application ;;
  worker)
    queues="${1:?worker needs its queues, e.g. worker celery}"
    # The scheduler's queue wants one process: it keeps the fleet in memory.
    default=2; [ "$queues" = scheduler ] && default=1
    exec python -m celery -A rackwise worker -Q "$queues" -n "$queues@%h" \
      --concurrency "${CONCURRENCY:-$default}" -l "${CELERY_LOG_LEVEL:-info}" ;;
  beat)
    exec python -m celery -A rackwise beat -l "${CELERY_LOG_LEVEL:-info}" --pidfile= ;;
  migrate)
    exec python manage.py migrate --noinput ;;
  manage)
    exec python manage.py "$@" ;;
  *)
    echo "rackwise-entrypoint: unknown role '$role' (web, worker QUEUES, beat, migrate, manage ...)" >&2
    exit 2 ;;
esac
