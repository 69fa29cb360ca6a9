#!/usr/bin/env python3
"""Checks of the deployment files that need no cluster and no container engine.

    check_deploy.py k8s SRC_DIR        renders every kustomization under deploy/k8s (resources
                                       and namespace, the only features they use), validates the
                                       result against the Kubernetes schemas (kubernetes-validate
                                       --strict) and checks that the pieces refer to each other
    check_deploy.py dashboards SRC_DIR every riskkv_ metric the Grafana dashboards query is one
                                       the binaries export
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"}


def render(directory):
    """The documents `kustomize build directory` gives for resources + namespace."""
    with open(os.path.join(directory, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    unknown = set(k) - {"apiVersion", "kind", "namespace", "resources"}
    if unknown:
        raise SystemExit(f"{directory}: kustomization uses {sorted(unknown)}, which this check "
                         "does not render")
    docs = []
    for r in k.get("resources", []):
        path = os.path.normpath(os.path.join(directory, r))
        if os.path.isdir(path):
            docs += render(path)
        else:
            with open(path) as f:
                docs += [d for d in yaml.safe_load_all(f) if d]
    for d in docs:
        if "namespace" in k and d["kind"] not in CLUSTER_SCOPED:
            d["metadata"]["namespace"] = k["namespace"]
    return docs


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check_refs(name, docs):
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    if len(names) != len(set(names)):
        fail(f"{name}: duplicate resources {names}")
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    configmaps = {c["metadata"]["name"] for c in by_kind.get("ConfigMap", [])}
    workloads = by_kind.get("DaemonSet", []) + by_kind.get("StatefulSet", [])
    for w in workloads:
        wname = w["metadata"]["name"]
        labels = w["spec"]["template"]["metadata"]["labels"]
        sel = w["spec"]["selector"]["matchLabels"]
        if any(labels.get(k) != v for k, v in sel.items()):
            fail(f"{name}: {wname}'s selector {sel} does not match its pods {labels}")
        if not any(all(labels.get(k) == v for k, v in s["spec"]["selector"].items())
                   for s in services.values()):
            fail(f"{name}: no Service selects {wname}'s pods")
        for c in w["spec"]["template"]["spec"]["containers"]:
            ports = {p["containerPort"] for p in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe"):
                port = c.get(probe, {}).get("grpc", {}).get("port")
                if port is None or port not in ports:
                    fail(f"{name}: {wname}'s {probe} must use the gRPC health service on a "
                         f"container port, has {c.get(probe)}")
            for ref in c.get("envFrom", []):
                if ref.get("configMapRef", {}).get("name") not in configmaps:
                    fail(f"{name}: {wname} reads a ConfigMap that is not deployed: {ref}")
            args = " ".join(c.get("args", []))
            m = re.search(r"--control=([\w.-]+):(\d+)", args)
            if m:
                host, port = m.group(1), int(m.group(2))
                svc = services.get(host.split(".")[0])
                if svc is None or port not in {p["port"] for p in svc["spec"]["ports"]}:
                    fail(f"{name}: {wname} follows a control plane at {host}:{port}, which no "
                         "Service provides")
                ns = host.split(".")[1] if "." in host else svc["metadata"]["namespace"]
                if ns != svc["metadata"]["namespace"]:
                    fail(f"{name}: {host} names namespace {ns}")
            if "riskkv-node" in args and "--advertise=$(NODE_IP)" in args:
                env = {e["name"]: e for e in c.get("env", [])}
                src = env.get("NODE_IP", {}).get("valueFrom", {}).get("fieldRef", {})
                if src.get("fieldPath") not in ("status.hostIP", "status.podIP"):
                    fail(f"{name}: {wname} advertises NODE_IP, not from the downward API")
            for key in ("requests", "limits"):
                if not c.get("resources", {}).get(key):
                    fail(f"{name}: {wname} has no resource {key}")
    for sm in by_kind.get("ServiceMonitor", []):
        sel = sm["spec"]["selector"]["matchLabels"]
        ports = {e["port"] for e in sm["spec"]["endpoints"]}
        matched = [s for s in services.values()
                   if all(s["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
        if not matched:
            fail(f"{name}: the ServiceMonitor selects no Service")
        for s in matched:
            if not ports & {p["name"] for p in s["spec"]["ports"]}:
                fail(f"{name}: Service {s['metadata']['name']} has no port {ports}")
    return by_kind


def k8s(src):
    roots = sorted(os.path.dirname(p) for p in
                   glob.glob(os.path.join(src, "deploy/k8s/**/kustomization.yaml"), recursive=True))
    if not roots:
        fail("no kustomization under deploy/k8s")
    validate = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
    for root in roots:
        docs = render(root)
        kinds = check_refs(root, docs)
        builtin = [d for d in docs if d["apiVersion"] != "monitoring.coreos.com/v1"]
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump_all(builtin, f)
        r = subprocess.run([validate, "--strict", "--quiet", f.name], capture_output=True,
                           text=True)
        os.unlink(f.name)
        if r.returncode != 0:
            fail(f"{root}: kubernetes-validate:\n{r.stdout}{r.stderr}")
        print(f"{os.path.relpath(root, src)}: {len(docs)} resources "
              f"({', '.join(sorted(kinds))}) valid")


def exported_metrics(src):
    names = set()
    for path in glob.glob(os.path.join(src, "services/**/*.cc"), recursive=True):
        with open(path) as f:
            names |= set(re.findall(r'\.Name\("(riskkv_\w+)"\)', f.read()))
    return names


def dashboards(src):
    exported = exported_metrics(src)
    if len(exported) < 10:
        fail(f"found only {sorted(exported)} in services/")
    files = glob.glob(os.path.join(src, "deploy/compose/grafana/dashboards/*.json"))
    used = {}
    for path in files:
        with open(path) as f:
            d = json.load(f)
        for p in d["panels"]:
            for t in p.get("targets", []):
                for m in re.findall(r"riskkv_\w+", t["expr"]):
                    used.setdefault(re.sub(r"_(bucket|sum|count)$", "", m), []).append(p["title"])
    if not used:
        fail("the dashboards query no riskkv metric")
    missing = {m: t for m, t in used.items() if m not in exported}
    if missing:
        fail(f"dashboards query metrics no binary exports: {missing}")
    print(f"{len(files)} dashboard(s) query {len(used)} metrics, all exported "
          f"({len(exported)} exported in all)")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("k8s", "dashboards"):
        raise SystemExit(__doc__)
    {"k8s": k8s, "dashboards": dashboards}[sys.argv[1]](sys.argv[2])
