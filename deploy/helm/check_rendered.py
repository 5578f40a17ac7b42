"""Checks on a rendered chart that the Kubernetes schemas cannot make (CI, .ci/run section 1).

    python deploy/helm/check_rendered.py rendered.yaml [LABEL]

- every workload's pod: non-root, seccomp RuntimeDefault, no service-account token;
- every container: no privilege escalation, read-only root filesystem, capabilities dropped,
  an image pinned to a tag or digest, a memory limit; long-running ones (those of a
  Deployment or StatefulSet, native sidecars included): startup, readiness and liveness probes;
- every Triton container: the restricted APIs (model-repository, shared-memory, trace,
  logging) over HTTP and gRPC, keyed by the control key from a Secret, HTTP and gRPC on
  loopback;
- every Deployment with more than one pod (or an autoscaler): a PodDisruptionBudget, and
  topology spread or pod anti-affinity; no PDB with both minAvailable and maxUnavailable;
- every training command (`cascade train`, `cascade retrain`): the export target of the Triton
  the gateways run, `--triton-target=gpu...` where a Triton container requests a GPU, `cpu`
  where none does (a release for FIL and ONNX Runtime never reaches a CPU Triton);
- every AlertmanagerConfig: the inhibitions of monitoring/alertmanager/alertmanager.yml, the
  same ones (the compose stack's Alertmanager and the operator's must hold back alike).
Prints one line per problem; exit 1 when there is any.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"}
LONG_RUNNING = {"Deployment", "StatefulSet", "DaemonSet"}
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
RESTRICTED = {"model-repository", "shared-memory", "trace", "logging"}
CONTROL_KEY_ENV = "CASCADE_TRITON__CONTROL_KEY"
ALERTMANAGER_YML = Path(__file__).resolve().parents[2] / "monitoring/alertmanager/alertmanager.yml"
TARGET = re.compile(r"--triton-target[= ]'?([\w-]+)")
MATCHER = re.compile(r'^\s*(\w+)\s*(=~|!~|!=|=)\s*"?(.*?)"?\s*$')


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod template's spec of a workload (a CronJob's through its job template)."""
    spec = doc["spec"]["jobTemplate"]["spec"] if doc["kind"] == "CronJob" else doc["spec"]
    return spec["template"]["spec"]


def is_triton(container: dict[str, Any]) -> bool:
    words = [*container.get("command", []), *container.get("args", [])]
    return "triton" in container["image"].rsplit("/", 1)[-1] or any(
        "tritonserver" in str(word) for word in words
    )


def restricted_apis(args: list[str], flag: str) -> set[str]:
    """The API groups `--<flag>=GROUPS:triton-control-key=$(CASCADE_TRITON__CONTROL_KEY)`
    restricts (only a flag keyed by the control key's variable counts)."""
    groups: set[str] = set()
    for arg in args:
        name, _, value = str(arg).partition("=")
        if name != f"--{flag}":
            continue
        apis, _, key = value.partition(":")
        if key == f"triton-control-key=$({CONTROL_KEY_ENV})":
            groups |= set(apis.split(","))
    return groups


def triton_problems(container: dict[str, Any]) -> list[str]:
    args = [str(a) for a in [*container.get("command", []), *container.get("args", [])]]
    problems = [
        f"needs --{flag} for {','.join(sorted(RESTRICTED - got))} keyed by ${CONTROL_KEY_ENV}"
        for flag in ("http-restricted-api", "grpc-restricted-protocol")
        if (got := restricted_apis(args, flag)) < RESTRICTED or not got
    ]
    key_from_secret = any(
        env.get("name") == CONTROL_KEY_ENV and "secretKeyRef" in env.get("valueFrom", {})
        for env in container.get("env", [])
    )
    if not key_from_secret:
        problems.append(f"needs {CONTROL_KEY_ENV} from a Secret (secretKeyRef)")
    for flag in ("--http-address", "--grpc-address"):
        if f"{flag}=127.0.0.1" not in args:
            problems.append(f"needs {flag}=127.0.0.1 (Triton's APIs on the pod's loopback only)")
    return problems


def container_problems(kind: str, container: dict[str, Any], sidecar: bool) -> list[str]:
    context = container.get("securityContext", {})
    image = container["image"]
    tag = image.rsplit("/", 1)[-1]
    checks = [
        (context.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation: false"),
        (context.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem: true"),
        ("ALL" in context.get("capabilities", {}).get("drop", []), "capabilities.drop: [ALL]"),
        (
            "@sha256:" in image or (":" in tag and not tag.endswith(":latest")),
            f"an image pinned to a tag or digest (not {image})",
        ),
        ("memory" in container.get("resources", {}).get("limits", {}), "a memory limit"),
    ]
    if kind in LONG_RUNNING or sidecar:
        checks += [(probe in container, probe) for probe in PROBES]
    problems = [f"needs {what}" for ok, what in checks if not ok]
    if is_triton(container):
        problems += triton_problems(container)
    return problems


def workload_problems(doc: dict[str, Any]) -> list[str]:
    pod = pod_spec(doc)
    context = pod.get("securityContext", {})
    checks = [
        (context.get("runAsNonRoot") is True, "securityContext.runAsNonRoot: true"),
        (
            context.get("seccompProfile", {}).get("type") == "RuntimeDefault",
            "securityContext.seccompProfile.type: RuntimeDefault",
        ),
        (pod.get("automountServiceAccountToken") is False, "automountServiceAccountToken: false"),
    ]
    problems = [f"needs {what}" for ok, what in checks if not ok]
    for init in pod.get("initContainers", []):
        sidecar = init.get("restartPolicy") == "Always"
        problems += [
            f"container {init['name']}: {p}" for p in container_problems(doc["kind"], init, sidecar)
        ]
    for container in pod["containers"]:
        problems += [
            f"container {container['name']}: {p}"
            for p in container_problems(doc["kind"], container, False)
        ]
    return problems


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted = selector.get("matchLabels", {})
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def availability_problems(docs: list[dict[str, Any]]) -> list[str]:
    """A Deployment with more than one pod: a PDB, and spread or anti-affinity."""
    scaled = {
        d["spec"]["scaleTargetRef"]["name"] for d in docs if d["kind"] == "HorizontalPodAutoscaler"
    }
    budgets = [d["spec"]["selector"] for d in docs if d["kind"] == "PodDisruptionBudget"]
    problems = [
        f"PodDisruptionBudget/{d['metadata']['name']}: sets both minAvailable and "
        "maxUnavailable (the API server refuses it)"
        for d in docs
        if d["kind"] == "PodDisruptionBudget"
        and {"minAvailable", "maxUnavailable"} <= set(d["spec"])
    ]
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        name = doc["metadata"]["name"]
        if doc["spec"].get("replicas", 1) <= 1 and name not in scaled:
            continue
        labels = doc["spec"]["template"]["metadata"].get("labels", {})
        if not any(selects(budget, labels) for budget in budgets):
            problems.append(f"Deployment/{name}: needs a PodDisruptionBudget")
        pod = pod_spec(doc)
        if not pod.get("topologySpreadConstraints") and not pod.get("affinity", {}).get(
            "podAntiAffinity"
        ):
            problems.append(
                f"Deployment/{name}: needs topologySpreadConstraints or podAntiAffinity"
            )
    return problems


def _inhibition(source: list[tuple], target: list[tuple], equal: list[str]) -> tuple:
    return (tuple(sorted(source)), tuple(sorted(target)), tuple(sorted(equal)))


def alertmanager_inhibitions(path: Path = ALERTMANAGER_YML) -> set[tuple]:
    """The inhibit_rules of an Alertmanager configuration file, as comparable tuples."""
    rules = set()
    for rule in yaml.safe_load(path.read_text()).get("inhibit_rules", []):
        sides = []
        for key in ("source_matchers", "target_matchers"):
            matches = [MATCHER.match(text) for text in rule.get(key, [])]
            if not all(matches):
                raise ValueError(f"{path}: cannot read the matchers {rule.get(key)}")
            sides.append([m.groups() for m in matches if m])
        rules.add(_inhibition(sides[0], sides[1], rule.get("equal", [])))
    return rules


def inhibition_problems(doc: dict[str, Any], expected: set[tuple]) -> list[str]:
    """An AlertmanagerConfig whose inhibitions differ from alertmanager.yml's."""

    def side(items: list[dict[str, str]]) -> list[tuple]:
        return [(i["name"], i.get("matchType", "="), i["value"]) for i in items]

    found = {
        _inhibition(
            side(r.get("sourceMatch", [])), side(r.get("targetMatch", [])), r.get("equal", [])
        )
        for r in doc.get("spec", {}).get("inhibitRules", [])
    }
    problems = [f"lacks the inhibition {rule} of alertmanager.yml" for rule in expected - found]
    return problems + [f"has an inhibition alertmanager.yml lacks: {r}" for r in found - expected]


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(doc)
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def export_target_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Training commands whose export target does not fit the gateways' Triton."""
    workloads = [d for d in docs if d.get("kind") in WORKLOADS]
    gpu = any(
        "nvidia.com/gpu" in c.get("resources", {}).get("limits", {})
        for d in workloads
        for c in _containers(d)
        if is_triton(c)
    )
    problems = []
    for doc in workloads:
        for c in _containers(doc):
            text = " ".join(str(w) for w in [*c.get("command", []), *c.get("args", [])])
            if "retrain" not in text and "cascade train" not in text:
                continue
            name = f"{doc['kind']}/{doc.get('metadata', {}).get('name')}: {c['name']}"
            targets = set(TARGET.findall(text))
            if not targets:
                problems.append(f"{name}: trains without --triton-target")
            elif gpu and not all(t.startswith("gpu") for t in targets):
                problems.append(f"{name}: exports for {sorted(targets)}, the Tritons have GPUs")
            elif not gpu and targets != {"cpu"}:
                problems.append(f"{name}: exports for {sorted(targets)}, no Triton has a GPU")
    return problems


def check(docs: Iterable[dict[str, Any] | None]) -> list[str]:
    """Every problem of the rendered documents, one line each."""
    objects = [doc for doc in docs if doc]
    problems = []
    for doc in objects:
        name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if doc.get("kind") in WORKLOADS:
            problems += [f"{name}: {problem}" for problem in workload_problems(doc)]
        if doc.get("kind") == "AlertmanagerConfig":
            expected = alertmanager_inhibitions()
            problems += [f"{name}: {problem}" for problem in inhibition_problems(doc, expected)]
    return problems + availability_problems(objects) + export_target_problems(objects)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    label = argv[2] if len(argv) == 3 else argv[1]
    with open(argv[1]) as stream:
        problems = check(yaml.safe_load_all(stream))
    for problem in problems:
        print(f"ci: {label}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
