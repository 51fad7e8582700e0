"""Job logs (#32): ``GET /api/jobs/<id>/logs/``, scoped like the job, redacted,
and a polling contract a follower (``rackwise logs -f``, the job page) can
rely on (``fleet.services.read.job_logs``). The simulated cluster writes the
lines here; a Slurm output file is read from the jobs directory (the real
Slurm cluster: tests/slurm/test_slurm_job_logs.py)."""

from __future__ import annotations

import os

import pytest

from fleet.models import Node
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import submit as job_services
from fleet.services.jobs.submit import JobSpec, submit_job

SECRET = "hf_" + "Zq8" * 12  # the shape of a Hugging Face token


def logs_url(job, **query) -> str:
    params = "&".join(f"{k}={v}" for k, v in query.items())
    return f"/api/jobs/{job.pk}/logs/" + (f"?{params}" if params else "")


def running(job):
    """Place the job on the first free node and start it (its start is now)."""
    nodes = Node.objects.filter(rack__name="r1").order_by("hostname")[:1]
    job_allocations.apply_placement(None, job.pk, {n.id: [0, 1, 2, 3] for n in nodes}, reason="test")
    return job_allocations.start_job(None, job.pk)


@pytest.fixture
def training(fleet, submitter, clock):
    """A running simulated job (expected 1000 s, a checkpoint every 300 s),
    started at the clock's zero, whose command carries a token."""
    job = submit_job(
        submitter,
        JobSpec(
            name="llama-ft",
            num_gpus=4,
            tenant="llm",
            expected_duration_s=1000,
            checkpoint_interval_s=300,
            slurm={
                "command": f"python train.py --hf-token {SECRET} --lr 3e-4",
                "env": {"WANDB_KEY": "w4ndb-k3y-0001"},
            },
        ),
    )
    return running(job)


def follow(client, job, offset: int = 0) -> tuple[list[str], dict]:
    """Read on from ``offset`` as a follower does, while ``more`` says bytes
    are already waiting; the lines and the last answer."""
    lines: list[str] = []
    for _ in range(1000):
        answer = client.get(logs_url(job, offset=offset)).json()
        assert answer["offset"] == offset
        lines += answer["lines"]
        offset = answer["next_offset"]
        if not answer["more"]:
            return lines, answer
    raise AssertionError("the log never ended")


# --- who may read it ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("persona", "status"),
    [("viewer_client", 200), ("operator_client", 200), ("submitter_client", 200), ("other_client", 404)],
)
def test_the_log_is_read_by_whoever_may_see_the_job(training, request, persona, status):
    client = request.getfixturevalue(persona)
    response = client.get(logs_url(training))
    assert response.status_code == status, response.content
    if status == 404:
        assert "llama-ft" not in response.content.decode()


def test_an_outsider_and_anonymous_are_refused(training, outsider_client, anon_client):
    assert outsider_client.get(logs_url(training)).status_code == 403
    assert anon_client.get(logs_url(training)).status_code == 401


# --- the simulated cluster's lines and the polling contract ------------------------


def test_the_simulated_cluster_writes_start_progress_checkpoints_and_end(training, submitter_client, clock):
    clock.at = 5.0  # 300 s in: 3 tenths of the expected run, one checkpoint
    answer = submitter_client.get(logs_url(training)).json()
    assert answer["available"] and answer["source"] == "simulated"
    texts = [line.split(" [sim] ", 1)[1] for line in answer["lines"]]
    assert texts[0] == f"job #{training.pk} llama-ft: started, 4 GPU(s)"
    assert texts[1].startswith("+ python train.py")
    assert texts[2] == "environment: WANDB_KEY"
    assert [t.split(":")[0] for t in texts[3:]] == ["step 100", "step 200", "step 300", "checkpoint 1 saved"]
    assert answer["lines"][0].startswith(training.started_at.strftime("%Y-%m-%dT%H:%M:%S"))
    assert not answer["finished"] and not answer["eof"] and answer["poll_after_s"] > 0

    clock.at = 20.0
    job_allocations.finish_job(None, training.pk, succeeded=True, reason="done")
    done = submitter_client.get(logs_url(training, offset=answer["next_offset"])).json()
    assert [line.split(" [sim] ", 1)[1].split(":")[0] for line in done["lines"]] == [
        "step 400",
        "step 500",
        "step 600",
        "checkpoint 2 saved",
        "step 700",
        "step 800",
        "step 900",
        "checkpoint 3 saved",
        f"job #{training.pk} completed",
    ]
    assert done["finished"] and done["eof"] and done["next_offset"] == done["size"]
    assert done["poll_after_s"] == 0


def test_following_by_offset_gives_each_line_once_and_ends_at_eof(training, submitter_client, clock):
    seen: list[str] = []
    offset = 0
    for minute in (0.5, 2.0, 2.0, 9.0):
        clock.at = minute
        answer = submitter_client.get(logs_url(training, offset=offset)).json()
        assert answer["offset"] == offset
        seen += answer["lines"]
        offset = answer["next_offset"]
        assert not answer["eof"]
    job_allocations.finish_job(None, training.pk, succeeded=False, reason="NCCL timeout")
    last = submitter_client.get(logs_url(training, offset=offset)).json()
    seen += last["lines"]
    assert last["eof"]
    whole = submitter_client.get(logs_url(training)).json()
    assert seen == whole["lines"]
    assert len(set(seen)) == len(seen)
    assert seen[-1].endswith(f"job #{training.pk} failed: NCCL timeout")


def test_a_read_is_bounded_and_more_says_to_read_on_at_once(training, submitter_client, clock, settings):
    clock.at = 20.0
    job_allocations.finish_job(None, training.pk, succeeded=True)
    whole = submitter_client.get(logs_url(training)).json()
    settings.RACKWISE_JOB_LOG_MAX_BYTES = 1024
    first = submitter_client.get(logs_url(training)).json()
    assert first["more"] and not first["eof"] and first["poll_after_s"] == 0
    assert first["next_offset"] <= 1024
    assert first["lines"] == whole["lines"][: len(first["lines"])]
    lines, last = follow(submitter_client, training)
    assert lines == whole["lines"] and last["eof"]


def test_tail_gives_the_last_lines_and_where_they_start(training, submitter_client, clock):
    clock.at = 12.0
    whole = submitter_client.get(logs_url(training)).json()["lines"]
    answer = submitter_client.get(logs_url(training, tail=2)).json()
    assert answer["lines"] == whole[-2:]
    assert answer["truncated"]
    again = submitter_client.get(logs_url(training, offset=answer["offset"])).json()
    assert again["lines"] == whole[-2:]
    assert again["next_offset"] == answer["next_offset"] == answer["size"]
    everything = submitter_client.get(logs_url(training, tail=10000)).json()
    assert everything["lines"] == whole and not everything["truncated"] and everything["offset"] == 0


def test_an_offset_past_the_end_reads_from_the_start(training, submitter_client, clock):
    clock.at = 2.0
    answer = submitter_client.get(logs_url(training, offset=10**9)).json()
    assert answer["restarted"] and answer["offset"] == 0 and answer["lines"]


def test_a_job_that_never_started_has_no_log_and_says_why(fleet, submitter, submitter_client):
    job = submit_job(submitter, JobSpec(name="waits", num_gpus=4, tenant="llm"))
    answer = submitter_client.get(logs_url(job)).json()
    assert answer["available"] is False and answer["lines"] == []
    assert "not started" in answer["reason"]
    assert not answer["eof"]  # it may still start: follow on
    job_services.cancel_job(submitter, job.pk)
    gone = submitter_client.get(logs_url(job)).json()
    assert gone["available"] is False and gone["finished"] and gone["eof"]


def test_the_webhook_cluster_says_it_keeps_no_logs(training, submitter_client, settings):
    settings.RACKWISE_CLUSTER = "webhook"
    answer = submitter_client.get(logs_url(training)).json()
    assert answer["source"] == "webhook" and answer["available"] is False
    assert "carries no job logs" in answer["reason"]


@pytest.mark.parametrize(
    ("query", "field", "words"),
    [
        ("offset=-1", "offset", "greater than or equal to 0"),
        ("offset=abc", "offset", "valid integer"),
        (f"offset={2**41}", "offset", "less than or equal to"),
        ("tail=0", "tail", "greater than or equal to 1"),
        ("tail=10001", "tail", "less than or equal to 10000"),
        ("tail=1.5", "tail", "valid integer"),
        ("tail=3&offset=0", "tail", "offset or tail, not both"),
    ],
)
def test_bad_offsets_and_tails_are_a_400_naming_the_field(training, submitter_client, query, field, words):
    response = submitter_client.get(f"/api/jobs/{training.pk}/logs/?{query}")
    assert response.status_code == 400
    assert words in " ".join(response.json()[field])


# --- redaction ------------------------------------------------------------------------


def test_secrets_in_the_log_are_redacted(training, submitter_client, operator_client):
    for client in (submitter_client, operator_client):
        response = client.get(logs_url(training))
        assert SECRET not in response.content.decode()
        command = next(line for line in response.json()["lines"] if "+ python" in line)
        assert command.endswith("+ python train.py --hf-token [redacted] --lr 3e-4")
        assert response.json()["redacted_lines"] == 1


def test_a_slurm_output_file_is_redacted_cut_at_whole_lines_and_kept_in_its_directory(
    fleet, submitter, submitter_client, settings, tmp_path
):
    """The Slurm adapter reads ``rackwise-<pk>-<slurm id>.out`` in the jobs
    directory (no Slurm command when it is there): a line still being written
    waits, values of the job's environment and secret-looking values are
    redacted, and a link out of the directory is not followed."""
    settings.RACKWISE_CLUSTER = "slurm"
    settings.RACKWISE_SLURM_JOBS_DIR = str(tmp_path)
    job = submit_job(
        submitter,
        JobSpec(
            name="s",
            num_gpus=4,
            tenant="llm",
            slurm={"command": "x", "env": {"DB_URL": "pg://u:hunter22@db"}},
        ),
    )
    running(job)
    job_services.set_external_id(job.pk, "4242")
    out = tmp_path / f"rackwise-{job.pk}-4242.out"
    out.write_text("epoch 1\nconnecting to pg://u:hunter22@db\nexport AWS_SECRET_ACCESS_KEY=abc/def+ghi\nepo")
    answer = submitter_client.get(logs_url(job)).json()
    assert answer["source"] == "slurm"
    assert answer["lines"] == [
        "epoch 1",
        "connecting to [redacted]",
        "export AWS_SECRET_ACCESS_KEY=[redacted]",
    ]
    assert answer["next_offset"] == answer["size"] - 3 and not answer["more"]
    with out.open("a") as f:
        f.write("ch 2 \u00e9t\u00e9\n")
    job_allocations.finish_job(None, job.pk, succeeded=True)
    rest = submitter_client.get(logs_url(job, offset=answer["next_offset"])).json()
    assert rest["lines"] == ["epoch 2 \u00e9t\u00e9"] and rest["eof"]

    out.unlink()
    os.symlink("/etc/passwd", out)
    refused = submitter_client.get(logs_url(job)).json()
    assert refused["available"] is False and "outside RACKWISE_SLURM_JOBS_DIR" in refused["reason"]
    assert "root:" not in str(refused)
