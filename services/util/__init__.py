"""Helpers the rest of ``services`` shares: background tasks, child processes, rotating logs,
Redis clients (and a throw-away redis-server), timeouts and breakers."""
