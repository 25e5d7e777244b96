#!/usr/bin/python3
"""deploy/kubernetes/*.yaml: well-formed, and consistent with itself.

Every document parses and has apiVersion, kind and metadata.name; the
Deployment runs one replica with the Recreate strategy (one writer of the
catalog), mounts the PersistentVolumeClaim at the data dir it passes with
--data-dir, names only volumes it declares and claims/config maps that exist
in the file; the Service selects the Deployment's pods and targets a port the
container declares; the container does not run as root. Exit 0 when all hold,
1 naming the first that does not.
"""
import glob
import os
import sys

import yaml


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "..", "deploy", "kubernetes")
    files = sorted(glob.glob(os.path.join(root, "*.yaml")))
    if not files:
        fail("no manifests in " + root)
    docs = []
    for path in files:
        with open(path) as f:
            try:
                loaded = [d for d in yaml.safe_load_all(f) if d is not None]
            except yaml.YAMLError as e:
                fail("%s: not YAML: %s" % (path, e))
        for d in loaded:
            for key in ("apiVersion", "kind", "metadata"):
                if key not in d:
                    fail("%s: a document without %s" % (path, key))
            if not d["metadata"].get("name"):
                fail("%s: a %s without metadata.name" % (path, d["kind"]))
            docs.append(d)
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    for kind in ("Deployment", "Service", "PersistentVolumeClaim"):
        if kind not in by_kind:
            fail("no " + kind)

    deploy = by_kind["Deployment"]["spikeguardd"]
    spec = deploy["spec"]
    if spec.get("replicas") != 1:
        fail("Deployment: replicas must be 1 (one writer of the catalog)")
    if spec.get("strategy", {}).get("type") != "Recreate":
        fail("Deployment: strategy must be Recreate (never two daemons on one volume)")
    labels = spec["template"]["metadata"]["labels"]
    if any(labels.get(k) != v for k, v in spec["selector"]["matchLabels"].items()):
        fail("Deployment: selector does not match the pod template's labels")
    pod = spec["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for v in volumes.values():
        if "persistentVolumeClaim" in v:
            claim = v["persistentVolumeClaim"]["claimName"]
            if claim not in by_kind["PersistentVolumeClaim"]:
                fail("volume %s: claim %s is not in the manifests" % (v["name"], claim))
        if "configMap" in v and v["configMap"]["name"] not in by_kind.get("ConfigMap", {}):
            fail("volume %s: config map %s is not in the manifests" % (v["name"], v["configMap"]["name"]))
    if len(pod["containers"]) != 1:
        fail("one container expected")
    c = pod["containers"][0]
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    for path, name in mounts.items():
        if name not in volumes:
            fail("mount %s names volume %s, which is not declared" % (path, name))
    data_dirs = [a.split("=", 1)[1] for a in c.get("args", []) if a.startswith("--data-dir=")]
    if len(data_dirs) != 1:
        fail("the container passes no --data-dir")
    if data_dirs[0] not in mounts or "persistentVolumeClaim" not in volumes[mounts[data_dirs[0]]]:
        fail("--data-dir %s is not on the persistent volume" % data_dirs[0])
    ctx = dict(pod.get("securityContext", {}))
    ctx.update(c.get("securityContext", {}))
    if not ctx.get("runAsNonRoot") or ctx.get("runAsUser", 0) == 0:
        fail("the daemon must not run as root")
    if ctx.get("allowPrivilegeEscalation", True):
        fail("allowPrivilegeEscalation must be false")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}

    svc = by_kind["Service"]["spikeguardd"]["spec"]
    if any(labels.get(k) != v for k, v in svc["selector"].items()):
        fail("Service: selector does not select the Deployment's pods")
    for p in svc["ports"]:
        t = p.get("targetPort", p["port"])
        if (isinstance(t, str) and t not in ports) or (isinstance(t, int) and t not in ports.values()):
            fail("Service port %s targets %s, which the container does not declare" % (p["port"], t))
    for probe in ("readinessProbe", "livenessProbe"):
        tcp = c.get(probe, {}).get("tcpSocket")
        if tcp is None:
            fail("container: no TCP " + probe)
        if tcp["port"] not in ports and tcp["port"] not in ports.values():
            fail("%s: port %s is not declared" % (probe, tcp["port"]))
    flags = by_kind.get("ConfigMap", {}).get("spikeguardd-config", {}).get("data", {}).get("spikeguardd.flags", "")
    listen = [l for l in flags.splitlines() if l.startswith("--listen=")]
    if listen and not listen[0].endswith(":%d" % ports.get("grpc", -1)):
        fail("--listen %s is not the container's grpc port" % listen[0])
    print("ok: %d documents in %d file(s)" % (len(docs), len(files)))


if __name__ == "__main__":
    main()
