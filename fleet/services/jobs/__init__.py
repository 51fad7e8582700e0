"""The Job aggregate's room: its lifecycle (the one writer of ``Job.state``),
submission and cancel, allocations (the one writer of ``Allocation``) and what
the fleet can ever hold (capacity)."""
