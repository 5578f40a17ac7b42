"""deploy/helm/check_rendered.py: the checks CI runs on the chart's renderings catch what
they are for (a Triton without its restricted APIs, a pod without its security settings, a
scaled Deployment without a PDB or spreading), and pass a compliant rendering."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location(
    "check_rendered", ROOT / "deploy/helm/check_rendered.py"
)
assert _spec and _spec.loader
check_rendered = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_rendered)

RESTRICTED = "model-repository,shared-memory,trace,logging"
KEY = "triton-control-key=$(CASCADE_TRITON__CONTROL_KEY)"
HARDENED = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
PROBES = {p: {"exec": {"command": ["true"]}} for p in check_rendered.PROBES}
LABELS = {"app.kubernetes.io/component": "gateway"}


def container(name: str, image: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "securityContext": dict(HARDENED),
        "resources": {"limits": {"memory": "1Gi"}},
        **PROBES,
        **extra,
    }


def triton(**extra: Any) -> dict[str, Any]:
    args = [
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        f"--http-restricted-api={RESTRICTED}:{KEY}",
        f"--grpc-restricted-protocol={RESTRICTED}:{KEY}",
    ]
    env = [
        {
            "name": "CASCADE_TRITON__CONTROL_KEY",
            "valueFrom": {"secretKeyRef": {"name": "s", "key": "triton-control-key"}},
        }
    ]
    fields = {"restartPolicy": "Always", "args": args, "env": env, **extra}
    return container("triton", "ghcr.io/x/cascade-triton:0.1.0", **fields)


def rendering() -> list[dict[str, Any]]:
    """A compliant gateway: Deployment with a Triton sidecar, its HPA and PDB."""
    pod = {
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "topologySpreadConstraints": [{"maxSkew": 1}],
        "initContainers": [triton()],
        "containers": [container("gateway", "ghcr.io/x/cascade-gateway:0.1.0")],
    }
    selector = {"matchLabels": dict(LABELS)}
    return [
        {
            "kind": "Deployment",
            "metadata": {"name": "gw"},
            "spec": {"template": {"metadata": {"labels": dict(LABELS)}, "spec": pod}},
        },
        {"kind": "HorizontalPodAutoscaler", "spec": {"scaleTargetRef": {"name": "gw"}}},
        {"kind": "PodDisruptionBudget", "metadata": {"name": "gw"}, "spec": {"selector": selector}},
    ]


def sidecar(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return docs[0]["spec"]["template"]["spec"]["initContainers"][0]


def test_a_compliant_rendering_passes() -> None:
    assert check_rendered.check(rendering()) == []


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--http-restricted-api", f"model-repository:{KEY}"),  # only model control
        ("--grpc-restricted-protocol", f"{RESTRICTED}:triton-control-key=hardcoded"),  # no env key
    ],
)
def test_a_triton_with_too_few_restricted_apis_fails(flag: str, value: str) -> None:
    docs = rendering()
    args = sidecar(docs)["args"]
    args[:] = [a for a in args if not a.startswith(flag)] + [f"{flag}={value}"]
    problems = check_rendered.check(docs)
    assert len(problems) == 1 and flag in problems[0] and "container triton" in problems[0]


def test_a_triton_listening_beyond_loopback_or_with_a_literal_key_fails() -> None:
    docs = rendering()
    triton_container = sidecar(docs)
    triton_container["args"] = [
        a.replace("--http-address=127.0.0.1", "--http-address=0.0.0.0")
        for a in triton_container["args"]
    ]
    triton_container["env"] = [{"name": "CASCADE_TRITON__CONTROL_KEY", "value": "literal"}]
    problems = "\n".join(check_rendered.check(docs))
    assert "--http-address=127.0.0.1" in problems and "from a Secret" in problems


def test_a_sidecar_needs_probes_and_hardening() -> None:
    docs = rendering()
    del sidecar(docs)["livenessProbe"]
    sidecar(docs)["securityContext"]["readOnlyRootFilesystem"] = False
    problems = "\n".join(check_rendered.check(docs))
    assert "livenessProbe" in problems and "readOnlyRootFilesystem" in problems


def test_an_unpinned_image_and_a_token_mount_fail() -> None:
    docs = rendering()
    pod = docs[0]["spec"]["template"]["spec"]
    pod["containers"][0]["image"] = "ghcr.io/x/cascade-gateway"
    pod["automountServiceAccountToken"] = True
    problems = "\n".join(check_rendered.check(docs))
    assert "pinned to a tag or digest" in problems and "automountServiceAccountToken" in problems


def test_a_scaled_deployment_needs_a_pdb_and_spreading() -> None:
    docs = copy.deepcopy(rendering())[:2]  # no PDB
    del docs[0]["spec"]["template"]["spec"]["topologySpreadConstraints"]
    problems = check_rendered.check(docs)
    assert problems == [
        "Deployment/gw: needs a PodDisruptionBudget",
        "Deployment/gw: needs topologySpreadConstraints or podAntiAffinity",
    ]


def test_a_single_pod_deployment_needs_neither() -> None:
    docs = rendering()[:1]
    docs[0]["spec"]["replicas"] = 1
    del docs[0]["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert check_rendered.check(docs) == []


def test_a_pdb_with_both_bounds_fails() -> None:
    docs = rendering()
    docs[2]["spec"].update(minAvailable=1, maxUnavailable=1)
    assert check_rendered.check(docs) == [
        "PodDisruptionBudget/gw: sets both minAvailable and maxUnavailable (the API server "
        "refuses it)"
    ]


def alertmanager_config(rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "AlertmanagerConfig",
        "metadata": {"name": "c"},
        "spec": {"inhibitRules": rules},
    }


def chart_rules() -> list[dict[str, Any]]:
    """alertmanager.yml's inhibitions written as the operator's AlertmanagerConfig has them."""
    rules = []
    for source, target, equal in check_rendered.alertmanager_inhibitions():
        rule: dict[str, Any] = {
            "sourceMatch": [{"name": n, "matchType": t, "value": v} for n, t, v in source],
            "targetMatch": [{"name": n, "matchType": t, "value": v} for n, t, v in target],
        }
        if equal:
            rule["equal"] = list(equal)
        rules.append(rule)
    return rules


def test_the_operators_inhibitions_must_be_alertmanager_ymls() -> None:
    assert len(chart_rules()) >= 3  # the breaker, whole-job and Triton-down inhibitions
    assert check_rendered.check([alertmanager_config(chart_rules())]) == []
    missing = chart_rules()[1:]
    assert any(
        "lacks the inhibition" in p for p in check_rendered.check([alertmanager_config(missing)])
    )
    extra = [
        *chart_rules(),
        {"sourceMatch": [{"name": "alertname", "value": "X"}], "targetMatch": []},
    ]
    assert any(
        "alertmanager.yml lacks" in p for p in check_rendered.check([alertmanager_config(extra)])
    )


def trainer(command: str) -> dict[str, Any]:
    job = {"kind": "Job", "metadata": {"name": "train"}}
    pod = {
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container("train", "ghcr.io/x/cascade-jobs:0.1.0", args=[command])],
    }
    return {**job, "spec": {"template": {"spec": pod}}}


@pytest.mark.parametrize(
    ("gpu", "command", "problem"),
    [
        (False, "cascade retrain --artifacts /a --triton-target=cpu", None),
        (True, "cascade retrain --artifacts /a --triton-target=gpu", None),
        (True, "exec cascade train --output /a --triton-target=gpu-tensorrt; fi", None),
        (False, "cascade retrain --artifacts /a", "trains without --triton-target"),
        (True, "cascade retrain --triton-target=cpu", "exports for ['cpu'], the Tritons have GPUs"),
        (False, "cascade train --triton-target=gpu", "exports for ['gpu'], no Triton has a GPU"),
    ],
)
def test_training_exports_for_the_tritons_the_gateways_run(
    gpu: bool, command: str, problem: str | None
) -> None:
    docs = rendering()
    if gpu:
        sidecar(docs)["resources"]["limits"]["nvidia.com/gpu"] = 1
    problems = check_rendered.check([*docs, trainer(command)])
    assert problems == ([] if problem is None else [f"Job/train: train: {problem}"])
