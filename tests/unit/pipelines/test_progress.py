"""Progress lines at most once per interval, never at the start."""

from __future__ import annotations

from pipelines.progress import Every


def test_due_at_most_once_per_interval_and_not_at_the_start() -> None:
    now = [100.0]
    every = Every(10.0, clock=lambda: now[0])
    seen = []
    for t in (100.0, 105.0, 110.0, 111.0, 119.9, 120.5, 150.0):
        now[0] = t
        seen.append(every.due())
    assert seen == [False, False, True, False, False, True, True]
    assert every.elapsed() == 50.0


def test_the_default_interval_is_read_when_made(monkeypatch) -> None:
    import pipelines.progress as progress

    monkeypatch.setattr(progress, "PROGRESS_S", 0.0)
    assert Every().due()  # a test can ask for every line
