from __future__ import annotations

import pytest

from core.redact import redact_text, redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@redis:6379/0", "redis://:***@redis:6379/0"),
        ("redis://app:s3cret@redis/1", "redis://app:***@redis/1"),
        ("rediss://token@host:6380", "rediss://***@host:6380"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_redact_url_masks_credentials_only(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_text_masks_every_url_in_a_message() -> None:
    text = "cannot reach redis://:pw1@a:1/0 nor 'http://u:pw2@b/x'"
    redacted = redact_text(text)
    assert "pw1" not in redacted and "pw2" not in redacted
    assert "a:1/0" in redacted and "b/x" in redacted
