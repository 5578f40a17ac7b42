"""``cascade report``: Prometheus answers become series; problems are named, not tracebacks."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

from cli.main import main
from control.dashboards.panels import Panel, Query, Threshold
from control.dashboards.report import (
    PrometheusUnavailable,
    panel_series,
    query_range,
)


def _client(handler) -> httpx.Client:
    return httpx.Client(base_url="http://prometheus", transport=httpx.MockTransport(handler))


def _matrix(*series: tuple[dict[str, str], list[tuple[float, str]]]) -> httpx.Response:
    result = [
        {"metric": labels, "values": [[t, v] for t, v in values]} for labels, values in series
    ]
    body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return httpx.Response(200, json=body)


def test_series_get_their_legend_from_the_labels_and_lose_non_finite_points() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/query_range"
        assert request.url.params["query"] == "ctr"
        return _matrix(
            ({"model_version": "3"}, [(1.0, "0.1"), (2.0, "NaN"), (3.0, "+Inf"), (4.0, "0.2")]),
            ({"model_version": "4"}, [(1.0, "NaN")]),
        )

    panel = Panel("CTR", (Query("ctr", "v{{model_version}}"),), thresholds=(Threshold(0.1, "A"),))
    series = panel_series(_client(handler), panel, 0.0, 10.0, 1.0)
    assert [(s.label, s.times, s.values) for s in series] == [("v3", [1.0, 4.0], [0.1, 0.2])]
    assert all(math.isfinite(v) for s in series for v in s.values)


def test_a_refused_query_names_the_query_and_prometheus_reason() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}
        return httpx.Response(400, json=body)

    with pytest.raises(PrometheusUnavailable, match=r"sum\(x.*parse error at char 3"):
        query_range(_client(handler), "sum(x", 0.0, 1.0, 1.0)


def test_the_command_writes_one_png_per_dashboard(tmp_path: Path, monkeypatch, capsys) -> None:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.params["query"])
        return _matrix(({"stage": "scoring"}, [(1.0, "0.004"), (2.0, "0.005")]))

    real_client = httpx.Client
    monkeypatch.setattr(
        "control.dashboards.report.httpx.Client",
        lambda **kw: real_client(transport=httpx.MockTransport(handler), **kw),
    )
    assert main(["report", "--out", str(tmp_path), "--minutes", "5"]) == 0
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == sorted(
        f"{uid}.png"
        for uid in ("cascade-service", "cascade-models", "cascade-drift", "cascade-cache-triton")
    )
    assert all((tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in pngs)
    assert len(seen) >= 20 and "no data" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "--minutes", "0"], "argument --minutes: must be a finite number > 0"),
        (["report", "--step", "-1"], "argument --step: must be a finite number >= 0"),
    ],
)
def test_bad_options_are_usage_errors_naming_them(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_an_absent_prometheus_is_a_failure_naming_it(capsys) -> None:
    assert main(["report", "--prometheus", "http://127.0.0.1:1"]) == 3
    assert "did not answer" in capsys.readouterr().err
