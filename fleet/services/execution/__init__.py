"""Carrying actions out and keeping Rackwise and the cluster in step: step
execution and rollback, the cluster sync (jobs ended there; Slurm's nodes, held
jobs and topology) and callbacks from a webhook cluster."""
