"""The engine: plan compiler, runners, lanes, replay and rank aggregation (private)."""
