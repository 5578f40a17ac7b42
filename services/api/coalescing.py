"""One send per small response: the status line and headers leave with the body.

uvicorn's httptools protocol writes a response's head and its body as two ``write`` calls,
and uvloop sends each at once (TCP_NODELAY): two segments per answer, and on loopback each
send costs the sender the receiver's wake-up (figures: docs/benchmarks/code-notes.md).
``CoalescingTransport`` holds a response head until the next write (the body) or until
the response completes or the connection closes, then sends them together. Anything else —
``100 Continue``, a refusal written whole — passes straight through.
"""

from __future__ import annotations

import asyncio
from typing import Any

_STATUS_PREFIX = b"HTTP/1.1 "
_CONTINUE = b"HTTP/1.1 100 "
_END_OF_HEAD = b"\r\n\r\n"


class CoalescingTransport:
    """Wraps a transport; everything but ``write``/``close`` is the wrapped transport's."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head + bytes(data))
        elif _is_response_head(data):
            self._head = bytes(data)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Send a held head now (the response ended without a body write: HEAD, 204)."""
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _is_response_head(data: bytes | bytearray | memoryview) -> bool:
    chunk = bytes(data[: len(_CONTINUE)])
    return (
        chunk.startswith(_STATUS_PREFIX)
        and not chunk.startswith(_CONTINUE)
        and bytes(data[-len(_END_OF_HEAD) :]) == _END_OF_HEAD
    )
