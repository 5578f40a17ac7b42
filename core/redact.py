"""Secrets never reach logs: URLs and messages with their credentials masked.

Every place that prints or raises with a connection URL (Redis, Triton) goes through
``redact_url``; free text that may embed one (a client library's error, a pydantic error
echoing its input) goes through ``redact_text``.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
# scheme://[user][:password]@host — the credentials part of any URL inside a text
_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/@\s'\"]+)@")


def redact_url(url: str) -> str:
    """``url`` with its password (and a user name that may be a token) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    userinfo = f"{user}:{MASK}" if parts.password is not None else MASK
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{host}"))


def redact_text(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``."""
    return _CREDENTIALS.sub(_mask_userinfo, text)


def _mask_userinfo(match: re.Match[str]) -> str:
    user, has_password, _ = match["userinfo"].partition(":")
    userinfo = f"{user}:{MASK}" if has_password else MASK  # same shape as redact_url
    return f"{match['scheme']}{userinfo}@"
