"""Timeouts nest: the embedding cache's Redis reads run inside the ranker call."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.settings import EmbeddingCacheSettings, Settings, TritonSettings


def test_default_timeouts_nest() -> None:
    settings = Settings()
    assert settings.embedding_cache.timeout_ms < settings.triton.timeout_ms


def test_a_cache_timeout_not_below_the_triton_timeout_is_refused_naming_both() -> None:
    with pytest.raises(ValidationError) as error:
        Settings(
            triton=TritonSettings(timeout_ms=40),
            embedding_cache=EmbeddingCacheSettings(timeout_ms=50),
        )
    message = str(error.value)
    assert "embedding_cache.timeout_ms (50)" in message and "triton.timeout_ms (40)" in message


def test_the_check_applies_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_TRITON__TIMEOUT_MS", "15")
    with pytest.raises(ValidationError, match=r"embedding_cache\.timeout_ms"):
        Settings()


def test_the_control_key_is_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_TRITON__CONTROL_KEY", "s3cret-key")
    settings = Settings()
    assert settings.triton.control_key is not None
    assert settings.triton.control_key.get_secret_value() == "s3cret-key"
    assert "s3cret-key" not in repr(settings) and "s3cret-key" not in str(settings.triton)
