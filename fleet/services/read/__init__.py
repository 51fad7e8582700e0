"""Read models: the fleet summary, fragmentation and samples for charts, the
attention list and the invariant checker. They write no aggregate."""
