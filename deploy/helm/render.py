"""Render the chart offline, as `helm template` does, for CI (no helm binary needed).

    python deploy/helm/render.py [-f VALUES.yaml ...] [--lint] > rendered.yaml

Runs Helm's own Go engine through the helm-python-sdk wheel (CI installs it pinned by hash,
.ci/run section 1). Values files merge left to right, like helm's -f. With --lint, `helm lint
--strict` findings of severity warning or error fail the run first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parent / "cascade"
WARNING = 2  # helm lint severities: 1 info, 2 warning, 3 error


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's merge of -f files: maps merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-f", "--values", type=Path, action="append", default=[])
    parser.add_argument("--name", default="cascade", help="release name (default: cascade)")
    parser.add_argument("--namespace", default="cascade")
    parser.add_argument("--lint", action="store_true", help="helm lint --strict first")
    args = parser.parse_args()
    values: dict[str, Any] = {}
    for path in args.values:
        if not path.is_file():
            parser.error(f"-f {path}: no such file")
        values = merge(values, yaml.safe_load(path.read_text()) or {})
    if args.lint:
        report = helm.lint(CHART, values, strict=True, namespace=args.namespace)
        problems = [m for m in report["messages"] if m["severity"] >= WARNING]
        for message in problems:
            print(f"helm lint: {message['path']}: {message['error']}", file=sys.stderr)
        if problems or report["errors"]:
            print(f"helm lint: {report['errors']}", file=sys.stderr)
            return 1
    chart = helm.Chart.load(CHART)
    try:
        rendered = chart.render(values, name=args.name, namespace=args.namespace, is_install=True)
    except helm.HelmError as error:
        print(f"helm template: {error}", file=sys.stderr)
        return 1
    for path in sorted(rendered):
        if path.endswith(".yaml") and rendered[path].strip():
            sys.stdout.write(f"---\n# Source: {path}\n{rendered[path].strip()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
