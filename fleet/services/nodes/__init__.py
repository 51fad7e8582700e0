"""The Node aggregate's room: its lifecycle (the one writer of ``Node.state``),
the moves operators, health checks and the cluster ask of a node, and the
inventory (racks and nodes created)."""
