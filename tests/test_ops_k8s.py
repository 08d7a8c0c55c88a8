"""Kubernetes: the server's ServiceAccount mounts no token and its pods are covered by a
PodDisruptionBudget whose selector matches them."""
from pathlib import Path

import yaml

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"


def _docs():
    return [d for p in sorted(K8S.glob("*.yaml")) if p.name != "kustomization.yaml"
            for d in yaml.safe_load_all(p.read_text()) if d]


def test_service_account_and_disruption_budget():
    by_kind = {d["kind"]: d for d in _docs()}
    pod = by_kind["Deployment"]["spec"]["template"]
    sa = by_kind["ServiceAccount"]
    assert sa["automountServiceAccountToken"] is False
    assert pod["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    pdb = by_kind["PodDisruptionBudget"]
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    resources = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert "policy.yaml" in resources
