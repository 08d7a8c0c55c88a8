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
    pod = by_kind["StatefulSet"]["spec"]["template"]
    sa = by_kind["ServiceAccount"]
    assert sa["automountServiceAccountToken"] is False
    assert pod["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    pdb = by_kind["PodDisruptionBudget"]
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    resources = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert "policy.yaml" in resources


def test_every_manifest_is_valid_kubernetes_strictly():
    """kubernetes-validate (strict: no unknown fields) on every manifest of deploy/k8s, the cluster's too;
    the ServiceMonitor (a Prometheus Operator CRD, no schema there) is checked field by field below."""
    import kubernetes_validate

    files = sorted(K8S.glob("*.yaml")) + sorted((K8S / "cluster").glob("*.yaml"))
    checked = 0
    for p in files:
        for doc in yaml.safe_load_all(p.read_text()):
            if doc and doc.get("kind") != "Kustomization":
                kubernetes_validate.validate(doc, "1.30.0", strict=True)
                checked += 1
    assert checked >= 8


def test_network_policy_probes_prestop_and_service_monitor():
    by_kind = {d["kind"]: d for d in _docs()}
    pod = by_kind["StatefulSet"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    policy = by_kind["NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    allowed = sorted(p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"])
    assert allowed == sorted(ports.values())                     # gRPC for the game servers, metrics for Prometheus
    assert all(rule["from"] for rule in policy["spec"]["ingress"])   # never open to every namespace
    # readiness is the service itself, liveness the process
    assert container["readinessProbe"]["grpc"]["service"] == "sapgrid.v1.SapgridService"
    assert container["livenessProbe"]["grpc"].get("service", "") == ""
    # preStop, then the server's graceful stop, all inside the pod's grace period
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert "time.sleep(5)" in sleep[-1]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert 5 + float(env["SAPGRID_GRACE_SECONDS"]) + 5 < pod["spec"]["terminationGracePeriodSeconds"]
    monitor = yaml.safe_load((K8S / "operator" / "servicemonitor.yaml").read_text())
    service = by_kind["Service"]
    assert monitor["kind"] == "ServiceMonitor" and monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_readiness_service_name_is_served(server):
    """The service the readiness probe asks for is one the server reports SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(server.address) as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="sapgrid.v1.SapgridService"), timeout=10).status
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_worlds_are_kept_on_a_persistent_volume():
    """The server's data directory is a mount of a PersistentVolumeClaim from the StatefulSet's
    volumeClaimTemplates (ReadWriteOnce, kept when the set is deleted or scaled), the single server's and
    each cluster replica's."""
    by_kind = {d["kind"]: d for d in _docs()}
    sts = by_kind["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volume = next(name for name, path in mounts.items() if path == env["SAPGRID_DATA_DIR"])
    template, = sts["spec"]["volumeClaimTemplates"]
    assert template["metadata"]["name"] == volume and template["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert volume not in {v["name"] for v in pod.get("volumes", [])}      # the claim, not another volume
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert sts["spec"]["serviceName"] == by_kind["Service"]["metadata"]["name"]
    assert "statefulset.yaml" in yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    cluster = [d for d in yaml.safe_load_all((K8S / "cluster" / "proxy-replicas.yaml").read_text())
               if d and d["kind"] == "StatefulSet"][0]
    c = cluster["spec"]["template"]["spec"]["containers"][0]
    data_dir = {e["name"]: e.get("value") for e in c["env"]}["SAPGRID_DATA_DIR"]
    mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    template = cluster["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    assert data_dir.startswith(mount[template].rstrip("/") + "/") or data_dir == mount[template]
