"""The service layer: every write to the fleet goes through a function here, in
one transaction, with its audit record. Views, the API, admin actions, commands
and tasks call these; they never write models themselves.

In rooms (the README's table): the owner rooms ``jobs``, ``nodes`` and
``actions`` hold each aggregate's lifecycle, the one writer of its state;
``decisions``, ``execution``, ``intake`` and ``read`` work through them, and
the owner rooms never call those."""
