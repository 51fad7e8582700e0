"""The deployment as files (deploy/, scripts/build-image), checked by the tools
that would run them: the systemd units by ``systemd-analyze verify``, the
Kubernetes manifests by ``kubernetes-validate`` (the API's schema; there is no
kube-apiserver here), the alert rules by ``promtool check rules`` and
``promtool test rules``; the compose file and the Containerfile against the
settings and the files they name. Each check is also shown to catch an error."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from django.test import Client

from fleet.choices import ActionKind, ActionState
from fleet.models import Action, Node
from fleet.prometheus import celery_queues
from fleet.services.intake.health import record_heartbeat
from tests.test_metrics import scrape

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"
KUBERNETES = DEPLOY / "kubernetes"
ALERTS = DEPLOY / "prometheus" / "rackwise-alerts.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "rackwise-alerts.test.yml"
CONTAINERFILE = DEPLOY / "container" / "Containerfile"
ENTRYPOINT = DEPLOY / "container" / "entrypoint.sh"
COMPOSE = DEPLOY / "compose.yaml"
# The oldest Kubernetes the manifests are checked against, and the newest
# kubernetes-validate knows.
KUBERNETES_VERSION = "1.33.0"

# What a deployment with DEBUG off must set: SECRET_KEY has no default then,
# ALLOWED_HOSTS is empty (every request a 400), and the database and Redis
# default to 127.0.0.1, which is not them on another host or in a container.
REQUIRED_ENV = {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL"}
# The processes every deployment runs (entrypoint roles; the workers' queues come
# from the settings' task routes).
ROLES = {"web", "worker", "beat", "migrate"}


def settings_env_names() -> set[str]:
    """Every variable the settings read (rackwise.env's helpers), each also as NAME_FILE."""
    names = set(
        re.findall(r'\benv_\w+\(\s*"([A-Z][A-Z0-9_]*)"', (ROOT / "rackwise" / "settings.py").read_text())
    )
    return names | {f"{n}_FILE" for n in names}


def yaml_documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# --- systemd -----------------------------------------------------------------


def verify_units(source: Path, tmp: Path) -> subprocess.CompletedProcess:
    """``systemd-analyze verify`` every unit of ``source`` and one worker instance
    per queue (a template verifies nothing by itself; its drop-ins apply to the
    instance). ExecStart must exist and User must be known here, so the install
    path becomes this checkout's, the interpreter this one, and User root; the
    environment file becomes optional."""
    python = "/opt/rackwise/.venv/bin/python"
    for unit in source.rglob("*"):
        if unit.is_file():
            text = unit.read_text().replace(python, sys.executable).replace("/opt/rackwise", str(ROOT))
            text = text.replace("User=rackwise", "User=root")
            text = text.replace("EnvironmentFile=/etc/rackwise/env", "EnvironmentFile=-/etc/rackwise/env")
            (tmp / unit.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            (tmp / unit.relative_to(source)).write_text(text)
    names = [f"./{u.name}" for u in sorted(tmp.glob("*")) if u.is_file() and "@." not in u.name]
    names += [f"./rackwise-worker@{queue}.service" for queue in celery_queues()]
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *names], cwd=tmp, capture_output=True, text=True, timeout=60
    )


needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")


@needs_systemd
def test_the_units_verify(tmp_path):
    result = verify_units(UNITS, tmp_path)

    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


@needs_systemd
def test_verify_catches_an_error_in_a_worker_drop_in(tmp_path):
    broken = tmp_path / "units"
    shutil.copytree(UNITS, broken)
    with (broken / "rackwise-worker@scheduler.service.d" / "concurrency.conf").open("a") as f:
        f.write("Restart=sometimes\n")

    (tmp_path / "verified").mkdir()
    result = verify_units(broken, tmp_path / "verified")

    assert "concurrency.conf:4: Failed to parse service restart specifier" in result.stderr, result.stderr


def test_the_worker_units_serve_every_queue():
    example = (UNITS / "rackwise-worker@.service").read_text()  # its enable line names one unit per queue
    for queue in celery_queues():
        assert f"rackwise-worker@{queue}" in example, f"the units start no worker for queue {queue}"
    assert "CONCURRENCY=1" in (UNITS / "rackwise-worker@scheduler.service.d" / "concurrency.conf").read_text()


# --- Kubernetes --------------------------------------------------------------


def manifests() -> list[dict]:
    return [doc for path in sorted(KUBERNETES.glob("*.yaml")) for doc in yaml_documents(path)]


def by_kind(kind: str) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for m in manifests() if m["kind"] == kind}


def test_the_manifests_validate_against_the_kubernetes_schema():
    for version in (KUBERNETES_VERSION, kubernetes_validate.latest_version()):
        for manifest in manifests():
            kubernetes_validate.validate(manifest, version, strict=True)
    assert {m["kind"] for m in manifests()} == {"ConfigMap", "Secret", "Deployment", "Service", "Job"}


def test_the_schema_catches_a_wrong_type_and_an_unknown_field():
    web = by_kind("Deployment")["rackwise-web"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({**web, "spec": {**web["spec"], "replicas": "two"}}, KUBERNETES_VERSION)
    container = {**web["spec"]["template"]["spec"]["containers"][0], "readinessprobe": {}}
    bad = {**web, "spec": {**web["spec"], "template": {"spec": {"containers": [container]}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def containers(manifest: dict) -> list[dict]:
    return manifest["spec"]["template"]["spec"]["containers"]


def test_the_manifests_run_every_process_from_one_config():
    deployments = by_kind("Deployment")
    args = {name: containers(d)[0]["args"] for name, d in deployments.items()}
    served = {a[1] for a in args.values() if a[0] == "worker"}
    assert served == set(celery_queues()), f"queues without a worker: {set(celery_queues()) - served}"
    assert ["web"] in args.values() and by_kind("Service")["rackwise-web"]["spec"]["selector"] == (
        deployments["rackwise-web"]["spec"]["selector"]["matchLabels"]
    )
    beat = deployments["rackwise-beat"]
    assert containers(beat)[0]["args"] == ["beat"]
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    # A worker's liveness probe pings the name the entry point gives it (queues@host).
    assert '-n "$queues@%h"' in ENTRYPOINT.read_text()
    for name, d in deployments.items():
        if args[name][0] == "worker":
            probe = containers(d)[0]["livenessProbe"]["exec"]["command"]
            assert f"inspect ping -t 10 -d {args[name][1]}@$(hostname)" in probe[-1], name
    scheduler = next(d for d in deployments.values() if containers(d)[0]["args"] == ["worker", "scheduler"])
    assert {"name": "CONCURRENCY", "value": "1"} in containers(scheduler)[0]["env"]
    assert containers(by_kind("Job")["rackwise-migrate"])[0]["args"] == ["migrate"]
    # Every pod reads the same ConfigMap and Secret, which set what the settings need.
    for manifest in [*deployments.values(), *by_kind("Job").values()]:
        env_from = containers(manifest)[0]["envFrom"]
        assert env_from == [
            {"configMapRef": {"name": "rackwise-config"}},
            {"secretRef": {"name": "rackwise-secrets"}},
        ]
    names = set(by_kind("ConfigMap")["rackwise-config"]["data"]) | set(
        by_kind("Secret")["rackwise-secrets"]["stringData"]
    )
    assert REQUIRED_ENV <= names, f"not set: {REQUIRED_ENV - names}"
    assert names <= settings_env_names(), f"not settings: {names - settings_env_names()}"


def test_the_web_probe_answers_as_the_kubelet_asks(settings):
    config = by_kind("ConfigMap")["rackwise-config"]["data"]
    web = containers(by_kind("Deployment")["rackwise-web"])[0]
    settings.ALLOWED_HOSTS = config["ALLOWED_HOSTS"].split(",")
    settings.SECURE_SSL_REDIRECT = True  # as DEBUG off has it
    settings.SECURE_PROXY_SSL_HEADER = (
        "HTTP_" + config["SECURE_PROXY_SSL_HEADER"].upper().replace("-", "_"),
        "https",
    )
    for probe in (web["readinessProbe"], web["livenessProbe"]):
        get = probe["httpGet"]
        headers = {h["name"]: h["value"] for h in get["httpHeaders"]}
        assert get["port"] == web["ports"][0]["name"]

        # No database: the test has none (pytest-django refuses a query).
        answer = Client().get(
            get["path"], headers={k: v for k, v in headers.items() if k != "Host"}, HTTP_HOST=headers["Host"]
        )
        assert answer.status_code == 200, answer

    # Without the proxy's header it would be the HTTPS redirect (not a probe's 2xx).
    assert Client().get(get["path"], HTTP_HOST=headers["Host"]).status_code == 301


# --- the image and compose ---------------------------------------------------


def containerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_the_containerfile_copies_files_that_exist_and_the_build_context_keeps():
    ignore = (ROOT / ".dockerignore").read_text().split()
    copies = [args.split() for op, args in containerfile_instructions() if op == "COPY"]
    assert copies
    for *sources, _dest in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file"
            kept = any(source == k[1:] or source.startswith(k[1:] + "/") for k in ignore if k.startswith("!"))
            assert kept, f"COPY {source}: .dockerignore leaves it out of the build context"
    # FROM is the base scripts/build-image imports, the entry point the script it copies.
    base = re.search(r'BASE_TAG="([^"$]+)\$SUITE"', (ROOT / "scripts" / "build-image").read_text())
    suite = re.search(r'SUITE="(\w+)"', (ROOT / "scripts" / "build-image").read_text())
    assert base and suite
    assert ("FROM", base[1] + suite[1]) in containerfile_instructions()
    entry = dict(containerfile_instructions())["ENTRYPOINT"]
    assert ["deploy/container/entrypoint.sh", "/usr/local/bin/rackwise-entrypoint"] in copies
    assert "/usr/local/bin/rackwise-entrypoint" in entry
    assert os.access(ENTRYPOINT, os.X_OK) and os.access(ROOT / "scripts" / "build-image", os.X_OK)


def run_entrypoint(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(
        ["sh", str(ENTRYPOINT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_entrypoint_runs_each_role_and_refuses_others():
    script = ENTRYPOINT.read_text()
    assert ROLES <= set(re.findall(r"^\s+(\w+)\)", script, re.M))
    # Its `manage` runs the real manage.py (Django's checks, with the deploy settings).
    result = run_entrypoint("manage", "check")
    assert result.returncode == 0 and "no issues" in result.stdout, result.stdout + result.stderr
    refused = run_entrypoint("serve")
    assert refused.returncode == 2 and "unknown role 'serve'" in refused.stderr


def test_the_compose_file_runs_the_whole_stack_from_one_image_and_env():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    rackwise = {n: s for n, s in services.items() if s["image"].startswith("${RACKWISE_IMAGE")}
    assert {"postgres", "redis"} <= set(services) - set(rackwise)
    commands = [s["command"] for s in rackwise.values()]
    assert {c[0] for c in commands} == ROLES
    assert ["beat"] in commands and sum(c == ["beat"] for c in commands) == 1
    assert {c[1] for c in commands if c[0] == "worker"} == set(celery_queues())
    for name, service in rackwise.items():
        env = set(service["environment"])
        assert REQUIRED_ENV <= env, f"{name} does not set {REQUIRED_ENV - env}"
        assert env <= settings_env_names(), f"{name} sets what no setting reads: {env - settings_env_names()}"
        assert service["environment"]["DATABASE_URL"].endswith("@postgres:5432/rackwise")
        assert service["environment"]["REDIS_URL"].startswith("redis://redis:")
        if name != "migrate":
            assert service["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert services["migrate"]["depends_on"]["postgres"] == {"condition": "service_healthy"}


# --- Prometheus alert rules --------------------------------------------------

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="no promtool (Debian's prometheus)"
)


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_the_rules():
    result = promtool("check", "rules", ALERTS.name, cwd=ALERTS.parent)

    assert result.returncode == 0 and "SUCCESS: 5 rules found" in result.stdout, result.stdout + result.stderr


@needs_promtool
def test_promtool_rule_tests_pass():
    result = promtool("test", "rules", ALERT_TESTS.name, cwd=ALERTS.parent)

    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


@needs_promtool
def test_the_rule_tests_fail_when_a_threshold_moves(tmp_path):
    shutil.copy(ALERT_TESTS, tmp_path)
    (tmp_path / ALERTS.name).write_text(ALERTS.read_text().replace("> 1800", "> 3600"))

    result = promtool("test", "rules", ALERT_TESTS.name, cwd=tmp_path)

    assert result.returncode == 1 and "RackwiseDecisionWaiting" in result.stdout + result.stderr


def test_each_alert_is_tested_firing_and_not_firing():
    alerts = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    cases = [c for t in yaml.safe_load(ALERT_TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    assert alerts == {
        "RackwiseDecisionWaiting",
        "RackwiseSchedulerLeaseLost",
        "RackwiseAgentSilent",
        "RackwiseRackDegraded",
        "RackwiseWebhookDeadLetters",
    }
    for alert in alerts:
        assert any(c["alertname"] == alert and c["exp_alerts"] for c in cases), f"{alert} never fires"
        assert any(c["alertname"] == alert and not c["exp_alerts"] for c in cases), f"{alert} always fires"


def test_every_metric_the_rules_use_is_served(fleet):
    Action.objects.create(kind=ActionKind.DEFRAG, state=ActionState.PROPOSED, title="a plan")
    record_heartbeat(
        Node.objects.get(hostname="r1-n01").pk, {"gpus": [{"index": i, "state": "ok"} for i in range(4)]}
    )
    served = set(scrape())
    exprs = [r["expr"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    used = {name for expr in exprs for name in re.findall(r"\brackwise_[a-z_]+", expr)}

    assert used <= served, f"the rules use metrics /metrics does not serve: {sorted(used - served)}"
    assert "rackwise_decision_leases_lost_total" in used and "rackwise_webhook_deliveries" in used
