"""The trace-replay simulator: an event-driven replay of a job trace on a fleet
of racks under each policy (``simulation``: ``Simulation``, ``simulate()``),
its queue passes (``queue``) and state and figures (``state``), the trace CSV
format (``trace``) and generator (``tracegen``), and the command line
(``python -m placement.sim.cli``)."""
