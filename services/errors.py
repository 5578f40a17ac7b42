"""Domain errors of the serving side and their one mapping to HTTP statuses.

Stages never raise HTTP errors; they degrade. What reaches the API layer is one of these.
"""

from __future__ import annotations

from core.errors import ArtifactError, CascadeError

__all__ = [
    "ArtifactError",
    "CascadeError",
    "DependencyUnavailable",
    "FeedbackNotDurable",
    "NotReady",
    "http_status",
]


class DependencyUnavailable(CascadeError):
    """A dependency (Redis, Triton) failed, timed out, or its circuit breaker is open."""

    def __init__(self, dependency: str, reason: str) -> None:
        self.dependency = dependency
        self.reason = reason
        super().__init__(f"{dependency}: {reason}")


class NotReady(CascadeError):
    """No release is loaded, so no answer at all is possible."""


class FeedbackNotDurable(CascadeError):
    """The store would not keep acknowledged feedback across a restart (no AOF)."""


def http_status(error: CascadeError) -> int:
    """The HTTP status of a domain error."""
    if isinstance(error, NotReady | DependencyUnavailable | FeedbackNotDurable):
        return 503
    return 500  # ArtifactError and anything else: the server's own fault
