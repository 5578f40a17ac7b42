"""CoalescingTransport: a response head leaves with the body, in one write."""

from __future__ import annotations

from services.api.coalescing import CoalescingTransport

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def _pair() -> tuple[CoalescingTransport, RecordingTransport]:
    inner = RecordingTransport()
    return CoalescingTransport(inner), inner  # type: ignore[arg-type]


def test_the_head_is_sent_with_the_body_in_one_write() -> None:
    transport, inner = _pair()
    transport.write(HEAD)
    assert inner.writes == []
    transport.write(b"ok")
    assert inner.writes == [HEAD + b"ok"]
    transport.write(b"more")  # later writes go straight out
    assert inner.writes[-1] == b"more"


def test_a_head_without_a_body_write_goes_out_on_flush_or_close() -> None:
    transport, inner = _pair()
    transport.write(HEAD)
    transport.flush()
    assert inner.writes == [HEAD]
    transport.flush()  # nothing held: nothing sent twice
    assert inner.writes == [HEAD]
    transport.write(HEAD)
    transport.close()
    assert inner.writes == [HEAD, HEAD] and inner.closed


def test_continue_and_whole_responses_pass_straight_through() -> None:
    transport, inner = _pair()
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    refusal = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 3\r\n\r\nbig"
    transport.write(refusal)
    assert inner.writes == [b"HTTP/1.1 100 Continue\r\n\r\n", refusal]


def test_everything_else_is_the_wrapped_transport() -> None:
    transport, _ = _pair()
    assert transport.get_extra_info("peername") == "info:peername"
