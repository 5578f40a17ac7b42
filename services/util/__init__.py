"""Helpers the rest of ``services`` shares: background tasks, child processes, rotating logs,
secret redaction, Redis clients (and a throw-away redis-server), timeouts and breakers."""
