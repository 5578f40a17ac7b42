"""A minimal Redis connection for the cache's miss reads: one socket, hiredis parsing.

A cache miss costs one MGET on the request path, so client overhead counts: redis-py spends
Python time per call on top of the round trip (connection pool, per-argument encoding,
response callbacks; figures: docs/benchmarks/code-notes.md); this sends the packed command
and parses the reply in C.
Only ``redis://`` URLs (host, port, optional password and db); anything else (TLS, unix
sockets) keeps using redis-py. Not thread-safe: one connection per thread. ``send`` and
``receive`` pipeline several commands (a Redis Cluster's per-node batches, sent to every node
before any reply is read).
"""

from __future__ import annotations

import copy
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import hiredis

from services.util.redis_client import node_url

RECV_BYTES = 1 << 20


def _pack(args: tuple[Any, ...]) -> bytes:
    """One command in RESP."""
    return hiredis.pack_command(args)


class RespConnection:
    """Blocking request/reply over one TCP socket; any socket error closes it (next call
    reconnects) and is raised as ``ConnectionError``."""

    def __init__(self, url: str, timeout_s: float, name: str | None = None) -> None:
        parsed = urlparse(node_url(url))
        if parsed.scheme != "redis":
            raise ValueError(f"RespConnection speaks plain redis:// only, got {url!r}")
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 6379
        self.password = parsed.password
        self.username = parsed.username or None
        self.db = int(parsed.path.lstrip("/") or 0)
        self.timeout_s = timeout_s
        self.name = name  # CLIENT SETNAME: shows in CLIENT LIST
        self._socket: socket.socket | None = None
        self._reader = hiredis.Reader()

    @staticmethod
    def supports(url: str) -> bool:
        """Whether ``url`` (a cluster URL: its nodes) is plain ``redis://``."""
        return urlparse(node_url(url)).scheme == "redis"

    def at(self, host: str, port: int) -> RespConnection:
        """A connection like this one (credentials, timeout, name) to another node."""
        other = copy.copy(self)
        other.host, other.port, other.db = host, port, 0  # a Cluster has database 0 only
        other._socket, other._reader = None, hiredis.Reader()
        return other

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._socket, self._reader = sock, hiredis.Reader()
        if self.password:
            auth = (
                ("AUTH", self.username, self.password) if self.username else ("AUTH", self.password)
            )
            self._exchange(_pack(auth))
        if self.db:
            self._exchange(_pack(("SELECT", self.db)))
        if self.name:
            self._exchange(_pack(("CLIENT", "SETNAME", self.name)))
        return sock

    def _exchange(self, packed: bytes) -> Any:
        assert self._socket is not None
        self._socket.sendall(packed)
        reply = self._reply()
        if isinstance(reply, hiredis.ReplyError):
            raise reply
        return reply

    def _reply(self) -> Any:
        """The next reply (an error reply is returned as a ``hiredis.ReplyError``)."""
        sock = self._socket
        assert sock is not None
        while True:
            reply = self._reader.gets()
            if reply is not False:
                return reply
            chunk = sock.recv(RECV_BYTES)
            if not chunk:
                raise ConnectionError(f"redis {self.host}:{self.port} closed the connection")
            self._reader.feed(chunk)

    def execute(self, *args: Any) -> Any:
        """Send one command and return its reply."""
        return self._guarded(lambda: self._exchange(_pack(args)))

    def send(self, commands: list[tuple[Any, ...]]) -> None:
        """Send ``commands`` in one write; ``receive`` reads their replies."""
        packed = b"".join(map(_pack, commands))
        self._guarded(lambda: self._socket.sendall(packed))  # type: ignore[union-attr]

    def receive(self, count: int) -> list[Any]:
        """The next ``count`` replies, error replies as ``hiredis.ReplyError`` values."""
        return self._guarded(lambda: [self._reply() for _ in range(count)])

    def _guarded(self, call: Callable[[], Any]) -> Any:
        try:
            if self._socket is None:
                self._connect()
            return call()
        except OSError as error:  # timeouts included
            self.close()
            raise ConnectionError(f"redis {self.host}:{self.port}: {error}") from error
        except hiredis.ReplyError:
            raise
        except Exception:
            self.close()  # a half-read reply must not be parsed as the next one
            raise

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
