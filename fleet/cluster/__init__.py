"""Adapters to the cluster Rackwise manages: one module per cluster kind
(``simulated``, ``webhook``, ``slurm``), behind the interface in
:mod:`fleet.cluster.base`, carrying out the typed steps of :mod:`fleet.steps`.

Adapters act on the outside world and report what it says. They never import
``fleet.tasks``: services call them, and what the cluster reports (a job ended,
a node went down) goes back through services."""
