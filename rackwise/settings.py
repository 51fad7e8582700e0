"""Rackwise settings. Everything that differs between machines comes from the
environment (see README, "Configuration"); parsing is strict and fails loudly."""

from __future__ import annotations

import logging
import secrets
import warnings
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from rackwise.env import env_bool, env_choice, env_cidrs, env_float, env_int, env_list, env_str, env_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("RACKWISE_VAR_DIR") or BASE_DIR / "var")

DEBUG = env_bool("DEBUG", False)


def _secret_key() -> str:
    key = env_str("SECRET_KEY")
    if key:
        return key
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is required when DEBUG is off; set SECRET_KEY (or SECRET_KEY_FILE), "
            "or DEBUG=1 for local development"
        )
    # Local use only: generated once so sessions survive restarts.
    path = VAR_DIR / "secret_key"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
for _origin in CSRF_TRUSTED_ORIGINS:
    if "://" not in _origin:
        raise ImproperlyConfigured(
            f"CSRF_TRUSTED_ORIGINS entry {_origin!r} needs a scheme, e.g. https://{_origin}"
        )

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "django_celery_beat",
    "fleet",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "fleet.middleware.LoginRequiredEverywhereMiddleware",
    "csp.middleware.CSPMiddleware",
]

# Content-Security-Policy on every page (django-csp): scripts only from the app
# itself (no inline script anywhere: data goes to pages as json_script), nothing
# from other origins, no framing. Inline style attributes stay allowed: the
# grids colour cells with them, and a style cannot run code.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

ROOT_URLCONF = "rackwise.urls"
WSGI_APPLICATION = "rackwise.wsgi.application"
ASGI_APPLICATION = "rackwise.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "fleet.context_processors.role",
            ],
        },
    },
]

# Database: PostgreSQL only. Rackwise relies on its semantics: REPEATABLE READ
# snapshots, SELECT ... SKIP LOCKED, transaction ids for the console's ?since=
# cursor, partial unique indexes. scripts/run starts a private one under var/
# when DATABASE_URL is not set.
_database_url = env_url(
    "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/rackwise", schemes=("postgres", "postgresql", "pgsql")
)
try:
    DATABASES = {"default": dj_database_url.parse(_database_url)}
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL is not usable: {exc}") from exc
# A connection pool per process: under ASGI each request may run on another
# thread, and per-thread persistent connections would pile up past the server's
# limit under load.
DATABASES["default"]["CONN_MAX_AGE"] = 0
# Every connection is checked (one round trip) before it is handed out, so one
# killed by a PostgreSQL restart or pg_terminate_backend is replaced instead of
# failing a request; rackwise.db is Django's backend with a check that clears
# every dead idle connection at once (see its docstring).
DATABASES["default"]["ENGINE"] = "rackwise.db"
DATABASES["default"]["OPTIONS"] = {
    "pool": {"min_size": 1, "max_size": env_int("DATABASE_POOL_SIZE", 10, minimum=1), "timeout": 30}
}

REDIS_URL = env_url("REDIS_URL", "redis://127.0.0.1:6379/0", schemes=("redis", "rediss", "unix"))

# channels_redis waits for a socket's next message with BZPOPMIN for
# RedisChannelLayer.brpop_timeout (5 s) at a time. redis-py's default read timeout
# is also 5 s, so on a quiet fleet the read lost that race about every 5.5 s and
# the socket closed with 1011. The read timeout must outlast the blocking pop.
CHANNEL_LAYER_READ_TIMEOUT_S = 30
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [
                {
                    "address": REDIS_URL,
                    "socket_timeout": CHANNEL_LAYER_READ_TIMEOUT_S,
                    "socket_connect_timeout": 5,
                }
            ],
            # A live-feed socket renews its groups with every ping (25 s): one that
            # vanished without a disconnect leaves them within 5 minutes (the
            # default, a day, kept about 0.3% of disconnects as stale members).
            "group_expiry": 300,
        },
    }
}

# The broker defaults to the same Redis; RabbitMQ works too (amqp://...).
CELERY_BROKER_URL = env_url(
    "CELERY_BROKER_URL", REDIS_URL, schemes=("redis", "rediss", "unix", "amqp", "amqps")
)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# Publishing gives up quickly when the broker is down: the rows are committed and
# the reconcile pass re-enqueues what they say is pending.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = "UTC"
# Event webhooks go out on their own queue (and, in production, their own
# worker), so a slow or dead endpoint never holds up a scheduling pass.
# Scheduling passes go to the scheduler's queue, taken by a worker of
# concurrency 1 that keeps the fleet in memory between passes (fleet.engine.
# LiveFleet): one process whose cache stays warm, rather than every worker
# loading the fleet for the pass it happens to get.
CELERY_TASK_ROUTES = {
    "fleet.tasks.schedule_pending": {"queue": "scheduler"},
    "fleet.tasks.deliver_webhooks": {"queue": "webhooks"},
    "fleet.tasks.deliver_webhook": {"queue": "webhooks"},
    "fleet.tasks.sweep_webhooks": {"queue": "webhooks"},
    # Failure detection and reconcile must not wait behind a burst of bulk work
    # in the default queue: they have a queue (and, in scripts/run, a worker) of their own.
    "fleet.tasks.detect_failures": {"queue": "control"},
    "fleet.tasks.reconcile": {"queue": "control"},
}

# --- Rackwise control loop -----------------------------------------------------------
RACKWISE_POLICY = env_choice(
    "RACKWISE_POLICY", "rackwise", ("rackwise", "first-fit", "random", "slurm-block", "kueue-tas")
)
# The cluster Rackwise drives (fleet.cluster): "simulated" (delays, optional
# injected failures, jobs that end after their expected duration), "webhook"
# (each step POSTed, HMAC-signed, to RACKWISE_WEBHOOK_URL; a signed callback to
# /api/actions/<id>/callback/ completes it) or "slurm".
# RACKWISE_EXECUTOR is the old name of this setting: still read, for one
# release, when RACKWISE_CLUSTER is not set, with a DeprecationWarning.
_CLUSTER_KINDS = ("simulated", "webhook", "slurm")
if (env_str("RACKWISE_CLUSTER") or "").strip() or not (env_str("RACKWISE_EXECUTOR") or "").strip():
    RACKWISE_CLUSTER = env_choice("RACKWISE_CLUSTER", "simulated", _CLUSTER_KINDS)
else:
    RACKWISE_CLUSTER = env_choice("RACKWISE_EXECUTOR", "simulated", _CLUSTER_KINDS)
    _deprecated = (
        "RACKWISE_EXECUTOR is deprecated and will be removed in the next release; "
        "set RACKWISE_CLUSTER instead"
    )
    warnings.warn(_deprecated, DeprecationWarning, stacklevel=1)
    logging.getLogger("rackwise.settings").warning(_deprecated)
# How often the cluster is asked what it did (jobs ended, cancelled): the
# fleet.tasks.sync_cluster beat task. The simulated cluster also asks for a sync
# when a job is due to end, so demo jobs complete on time whatever this is.
RACKWISE_CLUSTER_SYNC_S = env_int("RACKWISE_CLUSTER_SYNC_S", 15, minimum=1)
RACKWISE_WEBHOOK_URL = env_str("RACKWISE_WEBHOOK_URL", "")
RACKWISE_WEBHOOK_SECRET = env_str("RACKWISE_WEBHOOK_SECRET", "")
RACKWISE_WEBHOOK_TIMEOUT_S = env_float("RACKWISE_WEBHOOK_TIMEOUT_S", 600.0, minimum=1.0)
if RACKWISE_CLUSTER == "webhook" and not (RACKWISE_WEBHOOK_URL and RACKWISE_WEBHOOK_SECRET):
    raise ImproperlyConfigured(
        "RACKWISE_CLUSTER=webhook needs RACKWISE_WEBHOOK_URL and RACKWISE_WEBHOOK_SECRET"
    )
# Simulated cluster: seconds per step unit, chance that a step fails, and how
# many real seconds one second of a simulated job's expected duration takes.
RACKWISE_SIM_STEP_SECONDS = env_float("RACKWISE_SIM_STEP_SECONDS", 1.0, minimum=0.0)
RACKWISE_SIM_FAILURE_RATE = env_float("RACKWISE_SIM_FAILURE_RATE", 0.0, minimum=0.0)
RACKWISE_SIM_TIME_SCALE = env_float("RACKWISE_SIM_TIME_SCALE", 1.0, minimum=0.0)
# Heartbeats: a node silent this long becomes suspect, then failed.
RACKWISE_HEARTBEAT_SUSPECT_S = env_int("RACKWISE_HEARTBEAT_SUSPECT_S", 60, minimum=1)
RACKWISE_HEARTBEAT_FAILED_S = env_int("RACKWISE_HEARTBEAT_FAILED_S", 180, minimum=1)
# A rack's NVLink fabric is degraded (no new multi-node gangs there) once this many of
# its nodes report fabric trouble (IMEX down, a fabric health mask, NVLink errors
# rising); one node alone is that node's trouble (and IMEX is known to raise false
# alarms on idle nodes). Healthy again when none does.
RACKWISE_RACK_FABRIC_NODES = env_int("RACKWISE_RACK_FABRIC_NODES", 2, minimum=1)
# A gang on a degraded rack with less than this left (by its expected duration)
# runs its course there; longer ones (or unknown) are proposed a move.
RACKWISE_EVACUATE_MIN_REMAINING_S = env_int("RACKWISE_EVACUATE_MIN_REMAINING_S", 3600, minimum=0)
# The NVLink fabric (cluster UUID, clique) a GPU's agent reported is used for at most
# this long: by the fabric-mismatch flag (attention view, a node's signals) and by
# import_topology --from agents. An older report may predate a move or a rewiring.
RACKWISE_AGENT_FABRIC_MAX_AGE_S = env_int("RACKWISE_AGENT_FABRIC_MAX_AGE_S", 600, minimum=1)
# XID codes that fail a node (NVIDIA's XID catalog: uncorrectable ECC, fell off the
# bus, NVLink and GSP faults...).
RACKWISE_FATAL_XIDS = [
    int(x)
    for x in env_list(
        "RACKWISE_FATAL_XIDS", ["48", "62", "64", "74", "79", "92", "94", "95", "119", "120", "140"]
    )
]
# Defragmentation: scheduled hourly (editable in the admin), and sooner when the
# fleet's fragmentation or a required job's wait passes these thresholds.
RACKWISE_DEFRAG_FRAGMENTATION_THRESHOLD = env_float(
    "RACKWISE_DEFRAG_FRAGMENTATION_THRESHOLD", 0.5, minimum=0.0
)
RACKWISE_DEFRAG_WAIT_THRESHOLD_S = env_int("RACKWISE_DEFRAG_WAIT_THRESHOLD_S", 1800, minimum=1)
RACKWISE_DEFRAG_BUDGET_GPU_HOURS = env_float("RACKWISE_DEFRAG_BUDGET_GPU_HOURS", 200.0, minimum=0.0)
RACKWISE_DEFRAG_MAX_MOVES = env_int("RACKWISE_DEFRAG_MAX_MOVES", 8, minimum=1)
# Shared fleets (tenant quotas, see placement/quota.py): usage counts for fair
# share with this half-life (Slurm's PriorityDecayHalfLife default, 7 days); a
# preemption to start a job (a quota reclaim, a higher priority) runs without an
# operator up to this many GPU-hours lost, and waits for approval above it.
RACKWISE_FAIR_SHARE_HALF_LIFE_H = env_float("RACKWISE_FAIR_SHARE_HALF_LIFE_H", 168.0, minimum=0.01)
RACKWISE_RECLAIM_APPROVAL_GPU_HOURS = env_float("RACKWISE_RECLAIM_APPROVAL_GPU_HOURS", 50.0, minimum=0.0)
# The starvation bound (placement.quota.overdue): a pending job whose
# (waited + expected run) / max(expected run, FLOOR) reaches SLOWDOWN is admitted
# ahead of fair share, oldest first. 0 turns it off.
RACKWISE_OVERDUE_SLOWDOWN = env_float("RACKWISE_OVERDUE_SLOWDOWN", 2.0, minimum=0.0)
RACKWISE_OVERDUE_FLOOR_S = env_int("RACKWISE_OVERDUE_FLOOR_S", 3600, minimum=1)
# ...and a long job once it has waited this long, whatever its run (0: no cap).
RACKWISE_OVERDUE_CAP_S = env_int("RACKWISE_OVERDUE_CAP_S", 0, minimum=0)
# The scheduler keeps the fleet in memory between passes and reads only the racks
# that changed (fleet.engine.LiveFleet). VERIFY compares it with a fresh load on
# every pass and raises on a difference: the test suite's setting, too slow for
# production at scale.
RACKWISE_LIVE_FLEET = env_bool("RACKWISE_LIVE_FLEET", True)
RACKWISE_LIVE_FLEET_VERIFY = env_bool("RACKWISE_LIVE_FLEET_VERIFY", False)
# Read models (summary, fragmentation) shared through the cache. A worker
# recomputes them REFRESH_S after a change (at most once per REFRESH_S while
# changes keep coming), off the request path; a reader serves a stored figure up
# to MAX_AGE_S old after the fleet moved on, and computes only past that (no
# worker keeping up) or with no stored figure.
RACKWISE_READ_MODELS = env_bool("RACKWISE_READ_MODELS", True)
RACKWISE_READ_MODEL_REFRESH_S = env_float("RACKWISE_READ_MODEL_REFRESH_S", 1.0, minimum=0.0)
RACKWISE_READ_MODEL_MAX_AGE_S = env_float("RACKWISE_READ_MODEL_MAX_AGE_S", 10.0, minimum=0.0)
# The console's attention view counts pending jobs that have waited this long.
RACKWISE_WAIT_WARN_S = env_int("RACKWISE_WAIT_WARN_S", 3600, minimum=1)
# The console asks to confirm an approval whose cost passes this many GPU-hours.
RACKWISE_CONFIRM_GPU_HOURS = env_float("RACKWISE_CONFIRM_GPU_HOURS", 50.0, minimum=0.0)
# Executing actions silent this long are re-enqueued by reconcile.
RACKWISE_STALL_S = env_int("RACKWISE_STALL_S", 60, minimum=1)
# Event webhooks (operators register endpoints at /api/webhooks/): how long to
# wait for an endpoint, how many attempts before a delivery is dead, and the
# retry backoff (base x 3^n with jitter, capped).
RACKWISE_WEBHOOK_DELIVERY_TIMEOUT_S = env_float("RACKWISE_WEBHOOK_DELIVERY_TIMEOUT_S", 5.0, minimum=0.1)
RACKWISE_WEBHOOK_MAX_ATTEMPTS = env_int("RACKWISE_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1)
RACKWISE_WEBHOOK_BACKOFF_S = env_float("RACKWISE_WEBHOOK_BACKOFF_S", 10.0, minimum=0.0)
RACKWISE_WEBHOOK_BACKOFF_MAX_S = env_float("RACKWISE_WEBHOOK_BACKOFF_MAX_S", 3600.0, minimum=0.0)
# Demo mode: a workload generator, simulated job completion, failures and repairs.
RACKWISE_DEMO = env_bool("RACKWISE_DEMO", False)
# Placement export: the Kubernetes node label naming a node's NVLink domain.
RACKWISE_K8S_RACK_LABEL = env_str("RACKWISE_K8S_RACK_LABEL", "") or "nvidia.com/gpu.clique"
# /metrics: a scraper gets in with `Authorization: Bearer <RACKWISE_METRICS_TOKEN>`
# or from an address in RACKWISE_METRICS_ALLOW (CIDRs). Loopback only by default.
RACKWISE_METRICS_TOKEN = env_str("RACKWISE_METRICS_TOKEN", "") or ""
RACKWISE_METRICS_ALLOW = env_cidrs("RACKWISE_METRICS_ALLOW", ["127.0.0.0/8", "::1/128"])
# Per-GPU health series (temperature, power, ECC, ... of each GPU's latest reading):
# about 0.9 KB and 0.2 ms of each scrape per reporting GPU, so a fleet of hundreds
# of racks turns them off (node exporters such as DCGM's scale better there); the
# verdicts and the racks' fabric state stay.
RACKWISE_METRICS_GPU_SERIES = env_bool("RACKWISE_METRICS_GPU_SERIES", True)

# --- Slurm (issue #11): the Slurm adapter (fleet.cluster.slurm) and its sync ---------
# Directory of Slurm's clients (sbatch, scontrol, squeue, scancel); empty: PATH.
# `scripts/slurm-cluster start` prints the wrapper directory of its chroot.
RACKWISE_SLURM_BIN = env_str("RACKWISE_SLURM_BIN", "") or ""
# The partition Rackwise manages: its jobs go there, and held jobs submitted
# there directly (`sbatch --hold`) are adopted as Rackwise jobs.
RACKWISE_SLURM_PARTITION = env_str("RACKWISE_SLURM_PARTITION", "") or "gpu"
# Seconds between two syncs of Slurm's nodes and jobs into Rackwise.
RACKWISE_SLURM_SYNC_S = env_int("RACKWISE_SLURM_SYNC_S", 15, minimum=1)
# The tenant adopted Slurm jobs belong to (created when first needed).
RACKWISE_SLURM_TENANT = env_str("RACKWISE_SLURM_TENANT", "") or "slurm"
# Where the adapter writes job scripts and Slurm writes their output, as this
# process sees it, and as Slurm's nodes see it (they differ for a chroot or a
# shared file system mounted elsewhere; empty: the same path).
RACKWISE_SLURM_JOBS_DIR = env_str("RACKWISE_SLURM_JOBS_DIR", "") or ""
RACKWISE_SLURM_JOBS_DIR_IN_CLUSTER = env_str("RACKWISE_SLURM_JOBS_DIR_IN_CLUSTER", "") or ""
# A checkpoint step sends this signal to the job's batch script
# (`scancel --signal=SIG --batch`) and then waits this many seconds for it to save.
RACKWISE_SLURM_CHECKPOINT_SIGNAL = env_str("RACKWISE_SLURM_CHECKPOINT_SIGNAL", "") or "USR1"
RACKWISE_SLURM_CHECKPOINT_GRACE_S = env_float("RACKWISE_SLURM_CHECKPOINT_GRACE_S", 5.0, minimum=0.0)
# Longest a Slurm command may take before slurmctld counts as unreachable (the
# step is then retried with backoff).
RACKWISE_SLURM_TIMEOUT_S = env_float("RACKWISE_SLURM_TIMEOUT_S", 20.0, minimum=1.0)
# Longest a step waits for a Slurm job to reach a state (pending after a
# requeuehold, running after a release) before it reports "not yet".
RACKWISE_SLURM_WAIT_S = env_float("RACKWISE_SLURM_WAIT_S", 10.0, minimum=0.5)

# --- Job logs (issue #32): GET /api/jobs/<id>/logs/ and the job page ----------------
# The most bytes of a job's log one request reads (a follower asks again for more).
RACKWISE_JOB_LOG_MAX_BYTES = env_int("RACKWISE_JOB_LOG_MAX_BYTES", 65536, minimum=1024)
# How long a follower of a running job's log is told to wait between two reads.
RACKWISE_JOB_LOG_POLL_S = env_float("RACKWISE_JOB_LOG_POLL_S", 2.0, minimum=0.1)

# --- Decisions: proposal recheck and the decision lock (issue #10, items 2-3) --------
# A proposal waiting for an operator is re-checked against the fleet when a node of
# its racks changes, and at least this often: if the fleet made it obsolete (its
# plan no longer holds, or a cheaper one exists) it expires and is decided again.
RACKWISE_PROPOSAL_RECHECK_S = env_int("RACKWISE_PROPOSAL_RECHECK_S", 60, minimum=1)
# The fleet-wide decision lock lives this long unless the pass holding it renews
# it (it does so at every checkpoint, well inside the TTL); a killed pass blocks
# the others for at most this long.
RACKWISE_DECISION_LOCK_TTL_S = env_float("RACKWISE_DECISION_LOCK_TTL_S", 15.0, minimum=1.0)

# --- Intake bounds (webhook targets, topology import) --------------------------------
# Event webhooks go to public addresses only; these networks (CIDRs) are allowed
# too, for receivers the operator runs inside the network. Empty by default.
# (The webhook cluster adapter, RACKWISE_WEBHOOK_URL, is operator configuration and not
# checked against this list.)
RACKWISE_WEBHOOK_ALLOW_NETS = env_cidrs("RACKWISE_WEBHOOK_ALLOW_NETS", [])
# import_topology: the most GPUs a node may report (NVL72 trays have 4, HGX 8),
# and the share of the fleet's nodes an import may remove or retire without
# --allow-shrink.
RACKWISE_TOPOLOGY_MAX_GPUS_PER_NODE = env_int("RACKWISE_TOPOLOGY_MAX_GPUS_PER_NODE", 8, minimum=1)
RACKWISE_TOPOLOGY_MAX_SHRINK = env_float("RACKWISE_TOPOLOGY_MAX_SHRINK", 0.25, minimum=0.0)

# --- Rackwise API input bounds (issue #10, items 4, 8, 13) ---------------------------
# Lists: the largest page (?limit=) and the deepest ?offset=; beyond them a 400.
RACKWISE_API_MAX_LIMIT = env_int("RACKWISE_API_MAX_LIMIT", 1000, minimum=1)
RACKWISE_API_MAX_OFFSET = env_int("RACKWISE_API_MAX_OFFSET", 10_000_000, minimum=0)
# JSON bodies nested deeper than this are refused with a 400 (Python's parser
# recurses per level: a 100,000-deep body was a RecursionError).
RACKWISE_API_MAX_JSON_DEPTH = env_int("RACKWISE_API_MAX_JSON_DEPTH", 64, minimum=2)
# Defrag requests: the most moves and GPU-hours one plan may be given.
RACKWISE_DEFRAG_MAX_MOVES_LIMIT = env_int("RACKWISE_DEFRAG_MAX_MOVES_LIMIT", 1000, minimum=1)
RACKWISE_DEFRAG_MAX_BUDGET_GPU_HOURS = env_float(
    "RACKWISE_DEFRAG_MAX_BUDGET_GPU_HOURS", 1_000_000.0, minimum=0.001
)

# --- Rackwise hardening ----------------------------------------------------------------
# Django's cache (login-failure counters, API throttles) lives in the same Redis.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "rackwise",
        "TIMEOUT": 300,
    }
}
# Throttles: generous for signed-in users (the console polls); strict for
# failures, and never locking anyone out for others' failures (fleet.auth): after
# RACKWISE_LOGIN_MAX_FAILURES failed logins for one username from one client
# within RACKWISE_LOGIN_WINDOW_S, that client is refused for that username, even
# with the right password; the username's other clients that failed back off.
# Bad API tokens slow down only the client sending them (RACKWISE_TOKEN_MAX_FAILURES).
RACKWISE_THROTTLE_USER = env_str("RACKWISE_THROTTLE_USER", "") or "3000/min"
RACKWISE_LOGIN_MAX_FAILURES = env_int("RACKWISE_LOGIN_MAX_FAILURES", 5, minimum=1)
RACKWISE_LOGIN_WINDOW_S = env_int("RACKWISE_LOGIN_WINDOW_S", 900, minimum=1)
RACKWISE_TOKEN_MAX_FAILURES = env_int("RACKWISE_TOKEN_MAX_FAILURES", 20, minimum=1)
# The per-username backoff's longest delay, and the failures one address may
# make over all usernames before it is refused (fleet.auth).
RACKWISE_LOGIN_MAX_DELAY_S = env_int("RACKWISE_LOGIN_MAX_DELAY_S", 60, minimum=1)
RACKWISE_LOGIN_MAX_ADDRESS_FAILURES = env_int("RACKWISE_LOGIN_MAX_ADDRESS_FAILURES", 50, minimum=1)
# Trusted reverse proxies in front of the app (nginx, HAProxy, a load balancer):
# the client's address is read from X-Forwarded-For through this many (DRF's NUM_PROXIES).
RACKWISE_NUM_PROXIES = env_int("RACKWISE_NUM_PROXIES", 0, minimum=0)
# HTTPS: on by default when DEBUG is off; each can be turned off (for plain-http
# tests, or a proxy that already redirects). SECURE_PROXY_SSL_HEADER is off unless
# set (e.g. "X-Forwarded-Proto"): only a proxy that overwrites that header makes it safe.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
_proxy_header = env_str("SECURE_PROXY_SSL_HEADER", "") or ""
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_header.strip().upper().replace("-", "_"), "https") if _proxy_header.strip() else None
)
# Error pages (DEBUG) and error mails hide the password inside any URL setting
# (REDIS_URL, CELERY_BROKER_URL, CHANNEL_LAYERS, CACHES...).
DEFAULT_EXCEPTION_REPORTER_FILTER = "fleet.reporting.SafeExceptionReporterFilter"
# API tokens (django-rest-knox) are stored hashed; they never expire unless
# issued with an expiry (create_api_user --expires-days N).
REST_KNOX = {"TOKEN_TTL": None, "AUTH_HEADER_PREFIX": "Token"}
# A database that does not answer gives 503 with this Retry-After (seconds).
RACKWISE_DB_RETRY_AFTER_S = env_int("RACKWISE_DB_RETRY_AFTER_S", 5, minimum=1)
# Operators (staff) get the fleet's admin permissions from their role.
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "fleet.auth.OperatorPermissionsBackend",
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = DEBUG

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "fleet.api.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_THROTTLE_CLASSES": ["fleet.api.auth.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": RACKWISE_THROTTLE_USER},
    "DEFAULT_PERMISSION_CLASSES": ["fleet.permissions.HasRole"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "fleet.api.pagination.BoundedLimitOffsetPagination",
    "DEFAULT_PARSER_CLASSES": [
        "fleet.api.parsers.DepthLimitedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "fleet.api.schema.RackwiseAutoSchema",
    "EXCEPTION_HANDLER": "fleet.api.errors.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Rackwise API",
    "DESCRIPTION": "Fleet manager for rack-scale GPU clusters (NVL72 and friends).",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["fleet.permissions.HasRole"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "fleet.choices.JobState",
        "NodeStateEnum": "fleet.choices.NodeState",
        "GpuHealthEnum": "fleet.choices.GpuHealth",
        "RackKindEnum": "fleet.choices.RackKind",
        "ActionKindEnum": "fleet.choices.ActionKind",
        "ActionStateEnum": "fleet.choices.ActionState",
        "ApprovalModeEnum": "fleet.choices.ApprovalMode",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}
