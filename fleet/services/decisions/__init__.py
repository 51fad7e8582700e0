"""Decisions, made on the fleet as it is and recorded as actions: scheduling
passes, recoveries, defrag plans and the recheck of waiting proposals. They
call the owner rooms; no owner room calls them."""
