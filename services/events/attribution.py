"""What the server vouches for in a feedback event: its trust level, from the answer log.

An event counts as evidence about a model version (its KPIs, the hit rate, training rows
"served" by that version) only when its ``request_id`` names an answer this fleet logged,
for the same user, and the event's item was among the items that answer showed; the version
is then the one the server recorded, never one the client claims. An event without a
``request_id`` is ``organic`` (the user's own choice, not about an answer): a legitimate
training source, bounded in what it may weigh. Anything else is untrusted, kept apart with
its reason; ``unknown_id``: an event that would be served or organic but names a user or an
item the serving release's id maps do not know (its ids are stored as unknown, 0). The
levels are a fixed set, so they can be metric labels.
"""

from __future__ import annotations

from services.stores.base import Answer

SERVED = "served"
ORGANIC = "organic"
UNKNOWN_ID = "unknown_id"
UNTRUSTED = ("unknown_request", "user_mismatch", "item_not_shown", UNKNOWN_ID)
TRUST_LEVELS = (SERVED, ORGANIC, *UNTRUSTED)  # what the gateway gives an event
# Events the operator's own tools write into the streams (``control.retrain.replay``): as
# trusted as the base data set. The gateway never gives this level (clients cannot claim it).
IMPORTED = "imported"


def vouch(
    user_id: str, item_id: str, request_id: str | None, answer: Answer | None, known: bool = True
) -> tuple[str, int | None]:
    """The event's trust level and, when ``served``, the version that served its answer.

    ``answer`` is what the server logged under ``request_id`` (None: never logged, or
    expired); ``known``: whether the release's id maps know the event's user and item."""
    if not request_id:
        return (ORGANIC, None) if known else (UNKNOWN_ID, None)
    if answer is None:
        return "unknown_request", None
    if answer.user_id != user_id:
        return "user_mismatch", None
    if item_id not in answer.items:
        return "item_not_shown", None
    if not known:  # an unknown user's answer was logged for no one (user 0)
        return UNKNOWN_ID, None
    return SERVED, answer.version
