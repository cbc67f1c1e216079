#!/usr/bin/env python3
"""Generates the homelab example dump: kubectl List dumps and a DCGM exposition with history.

Python 3.11 standard library only; deterministic (fixed clock, fixed seed), so running it again
reproduces the committed files byte for byte:

    python3 examples/homelab/generate.py
"""

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The instant of the newest DCGM sample; every other timestamp is relative to it.
AT = datetime(2026, 11, 28, 9, 0, 0, tzinfo=timezone.utc)
HISTORY = timedelta(hours=2)
STEP = timedelta(seconds=30)
MODEL = "NVIDIA RTX A1000"
DRIVER = "580.95.05"
FB_TOTAL_MIB = 8188


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def ago(**kw) -> str:
    return ts(AT - timedelta(**kw))


def uid(name: str) -> str:
    """A stable, UUID-shaped uid derived from a name."""
    r = random.Random("uid:" + name)
    h = "%032x" % r.getrandbits(128)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"


def owner(api_version: str, kind: str, name: str, block: bool = True) -> dict:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid(kind + "/" + name),
        "controller": True,
        "blockOwnerDeletion": block,
    }


def kube_list(items: list) -> dict:
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}


def condition(kind: str, status: str, when: str, reason: str | None = None, message: str | None = None) -> dict:
    c = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": when}
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def running_status(node_ip: str, pod_ip: str, started: str, containers: list[tuple[str, str]], ready: bool = True) -> dict:
    flag = "True" if ready else "False"
    return {
        "phase": "Running",
        "conditions": [
            condition("PodReadyToStartContainers", "True", started),
            condition("Initialized", "True", started),
            condition("Ready", flag, started),
            condition("ContainersReady", flag, started),
            condition("PodScheduled", "True", started),
        ],
        "hostIP": node_ip,
        "hostIPs": [{"ip": node_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": started,
        "qosClass": "Burstable",
        "containerStatuses": [
            {
                "name": name,
                "image": image,
                "imageID": image.split(":")[0] + "@sha256:" + "%064x" % random.Random(image).getrandbits(256),
                "containerID": "containerd://" + "%064x" % random.Random("cid:" + name + started).getrandbits(256),
                "ready": ready,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": started}},
            }
            for name, image in containers
        ],
    }


def container(name: str, image: str, cpu: str, mem: str, gpu: bool = False, ports: list | None = None) -> dict:
    limits = {"cpu": cpu, "memory": mem}
    requests = {"cpu": cpu, "memory": mem}
    if gpu:
        limits["nvidia.com/gpu"] = "1"
        requests["nvidia.com/gpu"] = "1"
    c = {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": {"limits": limits, "requests": requests},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }
    if ports:
        c["ports"] = ports
    return c


def pod(ns: str, name: str, created: str, containers: list, node: str | None, status: dict, *,
        labels: dict | None = None, owner_ref: dict | None = None, extra_meta: dict | None = None,
        grace: int = 30, tolerations: bool = False) -> dict:
    meta = {
        "name": name,
        "namespace": ns,
        "uid": uid("Pod/" + ns + "/" + name),
        "resourceVersion": str(random.Random("rv:" + name).randint(100000, 999999)),
        "creationTimestamp": created,
        "labels": labels or {},
    }
    if owner_ref:
        meta["ownerReferences"] = [owner_ref]
    if extra_meta:
        meta.update(extra_meta)
    spec = {
        "containers": containers,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": grace,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "schedulerName": "default-scheduler",
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
    }
    if node:
        spec["nodeName"] = node
    if tolerations:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


NODES = [
    # name, internal IP, pod CIDR prefix, UUID, exporter pod
    ("lab-1", "192.168.10.11", "10.244.1", "GPU-3f6c1a2e-9d41-4b7a-8e2f-51c0a9d7b311", "nvidia-dcgm-exporter-4xk2p"),
    ("lab-2", "192.168.10.12", "10.244.2", "GPU-8a1d77c4-2b6e-4f09-9c3a-e4f2b8d06a52", "nvidia-dcgm-exporter-9tmqz"),
    ("lab-3", "192.168.10.13", "10.244.3", "GPU-c92e5b10-7f3d-4e88-a1b6-0d4c6e9f2a73", "nvidia-dcgm-exporter-r7hcv"),
    ("lab-4", "192.168.10.14", "10.244.4", "GPU-5b07e3d9-c168-4a2f-b7e4-93f1d2a8c604", "nvidia-dcgm-exporter-w2fjd"),
]


def nodes() -> list:
    out = []
    for i, (name, ip, cidr, _uuid, _exp) in enumerate(NODES):
        created = ago(days=190 - i)
        out.append({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "uid": uid("Node/" + name),
                "resourceVersion": str(random.Random("rv:" + name).randint(100000, 999999)),
                "creationTimestamp": created,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "beta.kubernetes.io/os": "linux",
                    "beta.kubernetes.io/arch": "amd64",
                    "node-role.kubernetes.io/control-plane": "" if i == 0 else None,
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": "NVIDIA-RTX-A1000",
                    "nvidia.com/gpu.count": "1",
                    "nvidia.com/gpu.memory": str(FB_TOTAL_MIB),
                    "nvidia.com/gpu.family": "ampere",
                    "nvidia.com/cuda.driver-version.full": DRIVER,
                },
                "annotations": {
                    "node.alpha.kubernetes.io/ttl": "0",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                },
            },
            "spec": {"podCIDR": cidr + ".0/24", "podCIDRs": [cidr + ".0/24"]},
            "status": {
                "capacity": {"cpu": "16", "memory": "65776628Ki", "pods": "110", "ephemeral-storage": "959786032Ki", "nvidia.com/gpu": "1"},
                "allocatable": {"cpu": "16", "memory": "65674228Ki", "pods": "110", "ephemeral-storage": "884538529110", "nvidia.com/gpu": "1"},
                "conditions": [
                    condition("MemoryPressure", "False", created, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                    condition("DiskPressure", "False", created, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                    condition("PIDPressure", "False", created, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                    condition("Ready", "True", ago(days=21), "KubeletReady", "kubelet is posting ready status"),
                ],
                "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                "nodeInfo": {
                    "kubeletVersion": "v1.34.2",
                    "containerRuntimeVersion": "containerd://2.1.4",
                    "kernelVersion": "6.8.0-88-generic",
                    "osImage": "Ubuntu 24.04.3 LTS",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            },
        })
        labels = out[-1]["metadata"]["labels"]
        for k in [k for k, v in labels.items() if v is None]:
            del labels[k]
    return out


NB_IMAGE = "kubeflownotebookswg/jupyter-pytorch-cuda-full:v1.10.0"


def notebook_pod(ns: str, nb: str, node: str, ip: str, created: str) -> dict:
    return pod(
        ns, f"{nb}-0", created,
        [container(nb, NB_IMAGE, "2", "8Gi", gpu=True, ports=[{"name": "notebook-port", "containerPort": 8888, "protocol": "TCP"}])],
        node, {},
        labels={
            "app": nb,
            "notebook-name": nb,
            "statefulset": nb,
            "controller-revision-hash": f"{nb}-6d5f8b9c47",
            "statefulset.kubernetes.io/pod-name": f"{nb}-0",
            "apps.kubernetes.io/pod-index": "0",
        },
        owner_ref=owner("apps/v1", "StatefulSet", nb),
        tolerations=True,
    )


# KubeRay's RayCluster team-ml/ray-sweep: a hyper-parameter sweep's cluster left running with its GPU
# worker idle. Its pods are as KubeRay's operator (ray-operator v1.5.0) writes them:
# `controllers/ray/common/pod.go` `labelPod` sets the labels below, `raycluster_controller.go`
# `buildHeadPod`/`buildWorkerPod` name them `<cluster>-head-` and `<cluster>-<group>-worker-`
# (generateName) and set the controller ownerReference to the RayCluster (`ray.io/v1`, its uid).
RAY_CLUSTER = "ray-sweep"
RAY_NS = "team-ml"
RAY_GROUP = "gpu"
RAY_VERSION = "2.46.0"
RAY_HEAD_POD = f"{RAY_CLUSTER}-head-8x4qn"
RAY_WORKER_POD = f"{RAY_CLUSTER}-{RAY_GROUP}-worker-t6kzr"
RAY_CREATED = dict(days=1, hours=20, minutes=5)


def ray_labels(node_type: str, group: str) -> dict:
    return {
        "ray.io/is-ray-node": "yes",
        "ray.io/cluster": RAY_CLUSTER,
        "ray.io/node-type": node_type,
        "ray.io/group": group,
        "ray.io/identifier": f"{RAY_CLUSTER}-{node_type}",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }


def ray_pods() -> list:
    started = ago(**RAY_CREATED)
    head_image = f"rayproject/ray:{RAY_VERSION}"
    worker_image = f"rayproject/ray:{RAY_VERSION}-gpu"
    head_ports = [{"name": "gcs-server", "containerPort": 6379, "protocol": "TCP"},
                  {"name": "dashboard", "containerPort": 8265, "protocol": "TCP"},
                  {"name": "client", "containerPort": 10001, "protocol": "TCP"}]
    head = pod(RAY_NS, RAY_HEAD_POD, started,
               [container("ray-head", head_image, "1", "4Gi", ports=head_ports)],
               "lab-4", running_status("192.168.10.14", "10.244.4.21", started, [("ray-head", head_image)]),
               labels=ray_labels("head", "headgroup"),
               owner_ref=owner("ray.io/v1", "RayCluster", RAY_CLUSTER))
    head["metadata"]["generateName"] = f"{RAY_CLUSTER}-head-"
    worker = pod(RAY_NS, RAY_WORKER_POD, started,
                 [container("ray-worker", worker_image, "2", "8Gi", gpu=True)],
                 "lab-4", running_status("192.168.10.14", "10.244.4.22", started, [("ray-worker", worker_image)]),
                 labels=ray_labels("worker", RAY_GROUP),
                 owner_ref=owner("ray.io/v1", "RayCluster", RAY_CLUSTER), tolerations=True)
    worker["metadata"]["generateName"] = f"{RAY_CLUSTER}-{RAY_GROUP}-worker-"
    return [head, worker]


def rayclusters() -> list:
    created = ago(**RAY_CREATED, seconds=2)
    ready = ago(days=1, hours=20, minutes=3)

    def template(name: str, image: str, cpu: str, mem: str, gpu: bool) -> dict:
        return {"spec": {"containers": [container(name, image, cpu, mem, gpu=gpu)]}}

    def ready_condition(kind: str, reason: str) -> dict:
        return {"type": kind, "status": "True", "reason": reason, "message": "",
                "lastTransitionTime": ready, "observedGeneration": 1}

    return [{
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": RAY_CLUSTER,
            "namespace": RAY_NS,
            "uid": uid("RayCluster/" + RAY_CLUSTER),
            "resourceVersion": str(random.Random("rv:rc:" + RAY_CLUSTER).randint(100000, 999999)),
            "generation": 1,
            "creationTimestamp": created,
            "labels": {"app": "hp-sweep"},
        },
        "spec": {
            "rayVersion": RAY_VERSION,
            "headGroupSpec": {
                "rayStartParams": {"dashboard-host": "0.0.0.0"},
                "template": template("ray-head", f"rayproject/ray:{RAY_VERSION}", "1", "4Gi", False),
            },
            "workerGroupSpecs": [{
                "groupName": RAY_GROUP,
                "replicas": 1,
                "minReplicas": 1,
                "maxReplicas": 1,
                "numOfHosts": 1,
                "rayStartParams": {},
                "template": template("ray-worker", f"rayproject/ray:{RAY_VERSION}-gpu", "2", "8Gi", True),
            }],
        },
        "status": {
            "state": "ready",
            "stateTransitionTimes": {"ready": ready},
            "lastUpdateTime": ready,
            "desiredCPU": "3",
            "desiredMemory": "12Gi",
            "desiredGPU": "1",
            "desiredTPU": "0",
            "desiredWorkerReplicas": 1,
            "minWorkerReplicas": 1,
            "maxWorkerReplicas": 1,
            "readyWorkerReplicas": 1,
            "availableWorkerReplicas": 1,
            "endpoints": {"client": "10001", "dashboard": "8265", "gcs-server": "6379", "metrics": "8080"},
            "head": {"podIP": "10.244.4.21", "podName": RAY_HEAD_POD, "serviceIP": "None",
                     "serviceName": f"{RAY_CLUSTER}-head-svc"},
            "conditions": [
                ready_condition("HeadPodReady", "HeadPodRunningAndReady"),
                ready_condition("RayClusterProvisioned", "AllPodRunningAndReadyFirstTime"),
            ],
            "observedGeneration": 1,
        },
    }]


def pods() -> list:
    out = []
    # kube-system and gpu-operator: no GPU claims.
    out.append(pod("kube-system", "coredns-7c65d6cfc9-h8x2m", ago(days=190),
                   [container("coredns", "registry.k8s.io/coredns/coredns:v1.12.1", "100m", "170Mi")],
                   "lab-1", running_status("192.168.10.11", "10.244.1.2", ago(days=21), [("coredns", "registry.k8s.io/coredns/coredns:v1.12.1")]),
                   labels={"k8s-app": "kube-dns", "pod-template-hash": "7c65d6cfc9"},
                   owner_ref=owner("apps/v1", "ReplicaSet", "coredns-7c65d6cfc9")))
    out.append(pod("kube-system", "coredns-7c65d6cfc9-q4r9t", ago(days=190),
                   [container("coredns", "registry.k8s.io/coredns/coredns:v1.12.1", "100m", "170Mi")],
                   "lab-2", running_status("192.168.10.12", "10.244.2.3", ago(days=21), [("coredns", "registry.k8s.io/coredns/coredns:v1.12.1")]),
                   labels={"k8s-app": "kube-dns", "pod-template-hash": "7c65d6cfc9"},
                   owner_ref=owner("apps/v1", "ReplicaSet", "coredns-7c65d6cfc9")))
    out.append(pod("kube-system", "metrics-server-6f7dd4c4c4-zb5lw", ago(days=120),
                   [container("metrics-server", "registry.k8s.io/metrics-server/metrics-server:v0.8.0", "100m", "200Mi")],
                   "lab-3", running_status("192.168.10.13", "10.244.3.4", ago(days=21), [("metrics-server", "registry.k8s.io/metrics-server/metrics-server:v0.8.0")]),
                   labels={"k8s-app": "metrics-server", "pod-template-hash": "6f7dd4c4c4"},
                   owner_ref=owner("apps/v1", "ReplicaSet", "metrics-server-6f7dd4c4c4")))
    exporter_image = "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04"
    for name, ip, cidr, _uuid, exp in NODES:
        out.append(pod("gpu-operator", exp, ago(days=21),
                       [container("nvidia-dcgm-exporter", exporter_image, "100m", "512Mi",
                                  ports=[{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}])],
                       name, running_status(ip, cidr + ".10", ago(days=21), [("nvidia-dcgm-exporter", exporter_image)]),
                       labels={"app": "nvidia-dcgm-exporter", "controller-revision-hash": "5b8c7d9f6d", "pod-template-generation": "1"},
                       owner_ref=owner("apps/v1", "DaemonSet", "nvidia-dcgm-exporter")))

    # team-ml/alice-nb: Running and Ready for 104 days, GPU idle.
    started = ago(days=104, hours=3, minutes=17)
    p = notebook_pod("team-ml", "alice-nb", "lab-1", "10.244.1.37", started)
    p["status"] = running_status("192.168.10.11", "10.244.1.37", started, [("alice-nb", NB_IMAGE)])
    out.append(p)

    # team-ml/bob-nb: the Notebook is stopped; its pod has been Terminating for 3 days (finalizer).
    started = ago(days=17, hours=6)
    p = notebook_pod("team-ml", "bob-nb", "lab-2", "10.244.2.41", started)
    p["metadata"]["deletionTimestamp"] = ago(days=3)
    p["metadata"]["deletionGracePeriodSeconds"] = 30
    p["metadata"]["finalizers"] = ["storage.example.com/unmount-protection"]
    p["status"] = running_status("192.168.10.12", "10.244.2.41", started, [("bob-nb", NB_IMAGE)], ready=False)
    out.append(p)

    # bench/llm-bench-7f9c: a Job pod keeping its card busy.
    started = ago(hours=5, minutes=42)
    image = "ghcr.io/example/llm-bench:2026.11"
    out.append(pod("bench", "llm-bench-7f9c", started,
                   [container("bench", image, "4", "24Gi", gpu=True)],
                   "lab-3", running_status("192.168.10.13", "10.244.3.52", started, [("bench", image)]),
                   labels={"batch.kubernetes.io/job-name": "llm-bench", "job-name": "llm-bench",
                           "batch.kubernetes.io/controller-uid": uid("Job/llm-bench"), "controller-uid": uid("Job/llm-bench")},
                   owner_ref=owner("batch/v1", "Job", "llm-bench"), tolerations=True))
    out[-1]["spec"]["restartPolicy"] = "Never"

    # trials/hp-trial-42: cannot be scheduled, every card is held.
    created = ago(minutes=40)
    image = "ghcr.io/example/hp-search-trial:0.9.3"
    out.append(pod("trials", "hp-trial-42", created,
                   [container("trial", image, "2", "8Gi", gpu=True)],
                   None,
                   {"phase": "Pending", "qosClass": "Guaranteed", "conditions": [
                       condition("PodScheduled", "False", ago(minutes=40), "Unschedulable",
                                 "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")]},
                   labels={"app": "hp-search", "trial": "hp-trial-42"}, tolerations=True))
    out[-1]["spec"]["restartPolicy"] = "Never"

    # team-ml/ray-sweep: the RayCluster's head (no GPU) and its GPU worker, both on lab-4.
    out.extend(ray_pods())
    return out


def notebooks() -> list:
    def nb(name: str, created: str, annotations: dict) -> dict:
        return {
            "apiVersion": "kubeflow.org/v1",
            "kind": "Notebook",
            "metadata": {
                "name": name,
                "namespace": "team-ml",
                "uid": uid("Notebook/" + name),
                "resourceVersion": str(random.Random("rv:nb:" + name).randint(100000, 999999)),
                "generation": 1,
                "creationTimestamp": created,
                "labels": {"app": name},
                "annotations": {"notebooks.kubeflow.org/server-type": "jupyter", **annotations},
            },
            "spec": {"template": {"spec": {"containers": [container(name, NB_IMAGE, "2", "8Gi", gpu=True)]}}},
            "status": {"readyReplicas": 1 if name == "alice-nb" else 0},
        }

    return [
        nb("alice-nb", ago(days=104, hours=3, minutes=18), {}),
        nb("bob-nb", ago(days=17, hours=6, minutes=1), {"kubeflow-resource-stopped": ago(days=3)}),
    ]


def statefulsets() -> list:
    def sts(name: str, replicas: int, created: str) -> dict:
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": name,
                "namespace": "team-ml",
                "uid": uid("StatefulSet/" + name),
                "resourceVersion": str(random.Random("rv:sts:" + name).randint(100000, 999999)),
                "generation": 2 if replicas == 0 else 1,
                "creationTimestamp": created,
                "ownerReferences": [owner("kubeflow.org/v1", "Notebook", name)],
            },
            "spec": {
                "replicas": replicas,
                "serviceName": "",
                "selector": {"matchLabels": {"statefulset": name}},
                "template": {"metadata": {"labels": {"statefulset": name, "notebook-name": name}},
                             "spec": {"containers": [container(name, NB_IMAGE, "2", "8Gi", gpu=True)]}},
            },
            "status": {"replicas": 1, "readyReplicas": 1 if replicas else 0, "availableReplicas": 1 if replicas else 0,
                       "currentReplicas": 1, "updatedReplicas": 1, "observedGeneration": 2 if replicas == 0 else 1},
        }

    return [sts("alice-nb", 1, ago(days=104, hours=3, minutes=18)), sts("bob-nb", 0, ago(days=17, hours=6, minutes=1))]


def quotas() -> list:
    def rq(ns: str, name: str, hard: dict, used: dict, created: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": name, "namespace": ns, "uid": uid("ResourceQuota/" + ns + "/" + name),
                         "resourceVersion": str(random.Random("rv:rq:" + name).randint(100000, 999999)),
                         "creationTimestamp": created},
            "spec": {"hard": hard},
            "status": {"hard": hard, "used": used},
        }

    return [
        rq("team-ml", "compute", {"requests.cpu": "16", "requests.memory": "64Gi", "limits.memory": "64Gi"},
           {"requests.cpu": "7", "requests.memory": "28Gi", "limits.memory": "28Gi"}, ago(days=180)),
        rq("bench", "gpu", {"requests.nvidia.com/gpu": "1", "requests.cpu": "8"},
           {"requests.nvidia.com/gpu": "1", "requests.cpu": "4"}, ago(days=60)),
    ]


# Per GPU: (exported pod, namespace, container) holding it, and how to draw its samples.
def dcgm() -> str:
    rng = random.Random(42)
    steps = int(HISTORY / STEP)
    times = [AT - STEP * (steps - i) for i in range(steps + 1)]
    workloads = {
        "lab-1": ("alice-nb-0", "team-ml", "alice-nb", lambda: 0.0, lambda: 2150 + rng.randint(-2, 2), lambda: 38 + rng.randint(0, 1)),
        "lab-2": ("bob-nb-0", "team-ml", "bob-nb", lambda: 0.0, lambda: 1830, lambda: 37 + rng.randint(0, 1)),
        "lab-3": ("llm-bench-7f9c", "bench", "bench", lambda: rng.uniform(0.955, 0.995), lambda: 7420 + rng.randint(-40, 40), lambda: 69 + rng.randint(0, 4)),
        # The Ray worker holds its CUDA context and nothing runs on it.
        "lab-4": (RAY_WORKER_POD, RAY_NS, "ray-worker", lambda: 0.0, lambda: 1214 + rng.randint(-1, 1), lambda: 36 + rng.randint(0, 1)),
    }
    help_text = [
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
        ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active."),
    ]
    # Draw every sample first (per node, per time) so the file layout does not change the values.
    values: dict[str, dict[str, list[str]]] = {name: {} for name, *_ in NODES}
    for name, *_ in NODES:
        _p, _ns, _c, util, fb, temp = workloads[name]
        per = values[name]
        for f, _ in help_text:
            per[f] = []
        for _t in times:
            u = util()
            used = fb()
            per["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].append(f"{u:.6f}")
            per["DCGM_FI_DEV_GPU_UTIL"].append(str(round(u * 100)))
            per["DCGM_FI_DEV_FB_USED"].append(str(used))
            per["DCGM_FI_DEV_FB_FREE"].append(str(FB_TOTAL_MIB - 245 - used))
            per["DCGM_FI_DEV_GPU_TEMP"].append(str(temp()))
    lines = ["# Prometheus /federate dump of dcgm-exporter series (scraped without honor_labels),",
             f"# {len(times)} samples per series at {int(STEP.total_seconds())}s steps, newest at {ts(AT)}."]
    for f, help_line in help_text:
        lines.append(f"# HELP {f} {help_line}")
        lines.append(f"# TYPE {f} gauge")
        for name, ip, _cidr, gpu_uuid, exp in NODES:
            pod_name, ns, cont, *_ = workloads[name]
            labels = (
                f'DCGM_FI_DRIVER_VERSION="{DRIVER}",Hostname="{name}",UUID="{gpu_uuid}",container="nvidia-dcgm-exporter",'
                f'device="nvidia0",exported_container="{cont}",exported_namespace="{ns}",exported_pod="{pod_name}",'
                f'gpu="0",instance="{ip}:9400",job="gpu-metrics",modelName="{MODEL}",namespace="gpu-operator",'
                f'pci_bus_id="00000000:01:00.0",pod="{exp}"'
            )
            for t, v in zip(times, values[name][f]):
                lines.append(f"{f}{{{labels}}} {v} {int(t.timestamp() * 1000)}")
    return "\n".join(lines) + "\n"


def write_json(name: str, items: list) -> None:
    (HERE / name).write_text(json.dumps(kube_list(items), indent=2) + "\n")


def main() -> None:
    write_json("nodes.json", nodes())
    write_json("pods.json", pods())
    write_json("notebooks.json", notebooks())
    write_json("statefulsets.json", statefulsets())
    write_json("quotas.json", quotas())
    write_json("rayclusters.json", rayclusters())
    (HERE / "dcgm.prom").write_text(dcgm())


if __name__ == "__main__":
    main()
