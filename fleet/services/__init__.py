"""The service layer: every write to the fleet goes through a function here, in
one transaction, with its audit record. Views, the API, admin actions, commands
and tasks call these; they never write models themselves."""
