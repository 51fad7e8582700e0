"""The database refuses a second active allocation of a GPU, whatever the code
above it does: two transactions racing on PostgreSQL leave exactly one."""

from __future__ import annotations

import threading

import pytest
from django.db import IntegrityError, connection, transaction

from fleet.models import GPU, Allocation
from fleet.services.errors import Conflict
from fleet.services.jobs.allocations import apply_placement
from fleet.services.jobs.submit import JobSpec, submit_job


@pytest.fixture
def two_jobs(fleet, submitter):
    return [submit_job(submitter, JobSpec(name=f"j{i}", num_gpus=4, tenant="llm")) for i in (1, 2)]


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_transactions_allocating_one_gpu_leave_one_allocation(two_jobs):
    gpu = GPU.objects.order_by("id").first()
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def allocate(job):
        try:
            with transaction.atomic():
                # Both transactions are open before either inserts; the second
                # insert then blocks on the unique index until the first commits.
                GPU.objects.select_related(None).get(pk=gpu.pk)
                barrier.wait(timeout=10)
                Allocation.objects.create(job=job, gpu=gpu)
            outcomes.append("committed")
        except IntegrityError:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=allocate, args=(job,)) for job in two_jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    assert sorted(outcomes) == ["committed", "refused"]
    assert Allocation.objects.filter(gpu=gpu, released_at__isnull=True).count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_placements_of_the_same_gpus_leave_one_placed_job(two_jobs):
    node = GPU.objects.order_by("id").first().node
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def place(job):
        barrier.wait(timeout=10)
        try:
            apply_placement(None, job.pk, {node.pk: [0, 1, 2, 3]}, reason="test")
            outcomes.append("placed")
        except Conflict:
            outcomes.append("conflict")
        finally:
            connection.close()

    threads = [threading.Thread(target=place, args=(job,)) for job in two_jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    assert sorted(outcomes) == ["conflict", "placed"]
    assert Allocation.objects.filter(released_at__isnull=True).count() == 4
    states = sorted(j.state for j in type(two_jobs[0]).objects.all())
    assert states == ["pending", "placed"]


def test_a_released_allocation_frees_the_gpu_for_another(two_jobs):
    gpu = GPU.objects.order_by("id").first()
    first = Allocation.objects.create(job=two_jobs[0], gpu=gpu)
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(job=two_jobs[1], gpu=gpu)
    first.released_at = first.created_at
    first.save()
    Allocation.objects.create(job=two_jobs[1], gpu=gpu)
    assert Allocation.objects.filter(gpu=gpu).count() == 2
