"""The Action aggregate's room: its lifecycle (the one writer of
``Action.state``, and of node holds), proposing and deciding, and each step
kind's rules (checked against the fleet, applied to the database)."""
