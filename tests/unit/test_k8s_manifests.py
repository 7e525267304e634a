"""infra/k8s, checked offline: every document against the Kubernetes JSON schemas of one pinned version
(strict: unknown fields are errors; KubeRay's RayCluster, a custom resource, against the fields of its v1 CRD
that the manifest uses, strictly, and its pod templates against Kubernetes' PodTemplate schema), then the
policies the schemas cannot express (limits, no inline secrets, a sandbox with no token, no network and a
seccomp profile or gVisor, probes on the rollout servers, Services that select something, Ray's token
authentication on). kubernetes-validate ships the schemas in its wheel; the network is blocked here."""

from __future__ import annotations

import copy
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
KUBERNETES_VERSION = "1.30.0"
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"}
CUSTOM = {"RayCluster"}  # custom resources: not in Kubernetes' schemas (RAY_CLUSTER_SCHEMA below)
SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL", re.IGNORECASE)
# an AWS access key id, or a credential assigned in clear in a file
INLINE_CREDENTIAL = re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b|aws_secret_access_key\s*[:=]", re.IGNORECASE)


def _load() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((str(path.relative_to(K8S)), doc))
    return docs


DOCS = _load()
RESOURCES = [(f, d) for f, d in DOCS if d["kind"] != "Kustomization"]


def _by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in RESOURCES if d["kind"] == kind]


def _ray_groups(cluster: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(group name, group spec) of a RayCluster: its head and each worker group."""
    yield "head", cluster["spec"]["headGroupSpec"]
    for group in cluster["spec"].get("workerGroupSpecs", []):
        yield group["groupName"], group


def _templates() -> Iterator[tuple[str, dict[str, Any]]]:
    """(workload name, pod template) of every workload, a RayCluster's groups included."""
    for _, d in RESOURCES:
        if d["kind"] in WORKLOADS:
            yield d["metadata"]["name"], d["spec"]["template"]
        elif d["kind"] == "RayCluster":
            for group, spec in _ray_groups(d):
                yield f"{d['metadata']['name']}/{group}", spec["template"]


def _containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    spec = template["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def _component(name: str) -> dict[str, Any]:
    found = [t for _, t in _templates() if t["metadata"]["labels"].get("app.kubernetes.io/component") == name]
    assert len(found) == 1, f"one workload with component={name}"
    return found[0]


def _pod_selector(policy: dict[str, Any]) -> dict[str, str]:
    return policy["spec"]["podSelector"].get("matchLabels", {})


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the manifest checks must not use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_the_manifests_are_all_listed_and_there():
    kustomization = [d for _, d in DOCS if d["kind"] == "Kustomization"]
    assert len(kustomization) == 1
    listed = set(kustomization[0]["resources"])
    assert listed == {f for f, _ in RESOURCES}, "kustomization.yaml lists exactly the manifests"
    kinds = {d["kind"] for _, d in RESOURCES}
    assert {"Namespace", "ServiceAccount", "Role", "RoleBinding", "Deployment", "StatefulSet", "Job"} <= kinds
    assert {"Service", "NetworkPolicy", "ConfigMap"} <= kinds
    assert all(d["metadata"].get("namespace", "rlfoundry") == "rlfoundry" for _, d in RESOURCES)


@pytest.mark.parametrize(
    "doc", [d for _, d in RESOURCES], ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in RESOURCES]
)
def test_validates_against_the_kubernetes_schema(doc):
    if doc["kind"] in CUSTOM:
        check_ray_cluster(doc)
        return
    assert kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True) == "1.30"


# The fields of KubeRay's RayCluster (ray.io/v1, operator v1.5) that a manifest here may use, strictly: a
# misspelled or unknown field is an error, as for Kubernetes' own kinds. Pod templates are checked separately.
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_GROUP = {
    "rayStartParams": _STR_MAP,
    "template": {"type": "object"},
}
RAY_CLUSTER_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayCluster"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["rayVersion", "headGroupSpec"],
            "additionalProperties": False,
            "properties": {
                "rayVersion": {"type": "string", "pattern": r"^\d+\.\d+\.\d+$"},
                "enableInTreeAutoscaling": {"type": "boolean"},
                "headGroupSpec": {
                    "type": "object",
                    "required": ["rayStartParams", "template"],
                    "additionalProperties": False,
                    "properties": {
                        **_GROUP,
                        "serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                    },
                },
                "workerGroupSpecs": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["groupName", "rayStartParams", "template", "maxReplicas"],
                        "additionalProperties": False,
                        "properties": {
                            **_GROUP,
                            "groupName": {"type": "string", "minLength": 1},
                            "replicas": {"type": "integer", "minimum": 0},
                            "minReplicas": {"type": "integer", "minimum": 0},
                            "maxReplicas": {"type": "integer", "minimum": 1},
                        },
                    },
                },
            },
        },
    },
}


def check_ray_cluster(doc: dict[str, Any]) -> None:
    """A RayCluster against ``RAY_CLUSTER_SCHEMA`` and each group's pod template against Kubernetes'
    PodTemplate schema (raises on the first error)."""
    import jsonschema

    jsonschema.validate(doc, RAY_CLUSTER_SCHEMA)
    for group, spec in _ray_groups(doc):
        wrapped = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{doc['metadata']['name']}-{group}"},
            "template": spec["template"],
        }
        kubernetes_validate.validate(wrapped, KUBERNETES_VERSION, strict=True)
        replicas = (spec.get("minReplicas", 0), spec.get("replicas", 0), spec.get("maxReplicas", 0))
        assert group == "head" or replicas[0] <= replicas[1] <= replicas[2], (
            f"{group}: min <= replicas <= max"
        )


def _misspelled(d: dict[str, Any]) -> None:
    d["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"


def _wrong_type(d: dict[str, Any]) -> None:
    d["spec"]["replicas"] = "four"


def _probe_port_object(d: dict[str, Any]) -> None:
    d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = {"number": 8000}


@pytest.mark.parametrize(
    "breakage, error",
    [
        (_misspelled, "'imagePullPolicyy' was unexpected"),
        (_wrong_type, "'four' is not of type 'integer'"),
        (_probe_port_object, "{'number': 8000} is not valid"),
    ],
)
def test_the_validator_rejects_a_broken_manifest(breakage, error):
    """The schema check is not vacuous: a misspelled field or a wrong type in the rollout StatefulSet fails,
    for that reason."""
    broken = copy.deepcopy(_by_kind("StatefulSet")[0])
    breakage(broken)
    with pytest.raises(kubernetes_validate.ValidationError) as caught:
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    assert error in caught.value.message


def test_every_container_has_resource_limits():
    for name, template in _templates():
        for c in _containers(template):
            limits = c.get("resources", {}).get("limits", {})
            assert {"cpu", "memory"} <= set(limits), f"{name}/{c['name']}: cpu and memory limits"
    for component in ("rollout", "trainer"):
        for c in _containers(_component(component)):
            assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1, f"{component} needs GPUs"


def _env_entries(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "env" and isinstance(value, list):
                yield from value
            else:
                yield from _env_entries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _env_entries(item)


def test_no_secret_is_written_inline():
    assert not _by_kind("Secret"), "Secrets are created beside the manifests, never committed"
    for _, d in RESOURCES:
        for entry in _env_entries(d):
            if SECRET_NAME.search(entry["name"]):
                assert "value" not in entry and "valueFrom" in entry, f"{entry['name']} must use valueFrom"
    for cm in _by_kind("ConfigMap"):
        assert not [k for k in cm.get("data", {}) if SECRET_NAME.search(k)], "no credentials in ConfigMaps"
    for path in K8S.rglob("*"):
        if path.is_file():
            assert not INLINE_CREDENTIAL.search(path.read_text()), f"{path.name}: an inline credential"


def _denies_all(policy: dict[str, Any], direction: str) -> bool:
    spec = policy["spec"]
    return direction.capitalize() in spec.get("policyTypes", []) and not spec.get(direction.lower())


def test_sandbox_pods_have_no_token_no_network_and_a_confining_profile():
    template = _component("sandbox")
    spec, labels = template["spec"], template["metadata"]["labels"]
    assert spec["automountServiceAccountToken"] is False
    assert spec.get("hostNetwork") is not True and spec.get("hostPID") is not True
    policies = [p for p in _by_kind("NetworkPolicy") if _selects(_pod_selector(p), labels)]
    assert any(_denies_all(p, "egress") for p in policies), "a NetworkPolicy denies all egress"
    assert any(_denies_all(p, "ingress") for p in policies), "a NetworkPolicy denies all ingress"
    profiles = [spec.get("securityContext", {}).get("seccompProfile", {})]
    profiles += [c.get("securityContext", {}).get("seccompProfile", {}) for c in _containers(template)]
    localhost = [p["localhostProfile"] for p in profiles if p.get("type") == "Localhost"]
    assert localhost or spec.get("runtimeClassName") in {"gvisor", "kata"}
    for profile in localhost:  # the profile the manifest names is the one shipped here
        assert (K8S / "seccomp" / Path(profile).name).is_file(), profile
    for c in _containers(template):
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert "privileged" not in c["securityContext"]


def test_the_seccomp_profile_allows_namespaces_and_refuses_the_kernel_admin_calls():
    profile = json.loads((K8S / "seccomp" / "rlfoundry-sandbox.json").read_text())
    denied = {n for rule in profile["syscalls"] if rule["action"] != "SCMP_ACT_ALLOW" for n in rule["names"]}
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert not denied & {"unshare", "clone", "clone3", "setns", "mount", "umount2", "pivot_root"}
    assert {"bpf", "init_module", "kexec_load", "ptrace", "keyctl", "perf_event_open"} <= denied


def test_rollout_servers_are_probed_and_stay_internal():
    vllm = [c for _, t in _templates() for c in _containers(t) if "vllm" in c.get("command", [])]
    assert vllm, "a vLLM server container"
    for c in vllm:
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert not _by_kind("Ingress"), "/collective_rpc must not be exposed"
    for c in vllm:  # behind the run's token, new weights fetched from the store (infra/rollout_auth.py)
        command = c["command"] + c.get("args", [])
        assert command[command.index("--middleware") + 1] == "infra.rollout_auth.TokenAuth"
        assert "infra.rollout_auth.StoreCheckpointLoader" in command
        token = {e["name"]: e for e in c["env"]}["RLFOUNDRY_SERVER_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert token == {"name": "rlfoundry-rollout-token", "key": "RLFOUNDRY_ROLLOUT_TOKEN"}
    for svc in _by_kind("Service"):
        assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]


def test_every_service_selects_a_pod_template():
    labels = [t["metadata"]["labels"] for _, t in _templates()]
    for svc in _by_kind("Service"):
        selector = svc["spec"]["selector"]
        assert selector and any(_selects(selector, lab) for lab in labels), svc["metadata"]["name"]
    for _, d in RESOURCES:  # and each workload's selector matches its own template
        if d["kind"] in WORKLOADS and "selector" in d["spec"]:
            assert _selects(d["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"])


def test_the_trainer_has_shared_memory_and_a_rendezvous_name():
    job = _by_kind("Job")[0]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    service = next(s for s in _by_kind("Service") if s["metadata"]["name"] == pod["subdomain"])
    assert service["spec"]["clusterIP"] == "None"
    dshm = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
    assert dshm[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    command = " ".join(pod["containers"][0]["command"])
    assert f"--nnodes={spec['completions']}" in command
    assert f"--master-addr={job['metadata']['name']}-0.{pod['subdomain']}" in command


def test_the_rollout_pods_start_vllm_with_the_same_arguments_as_every_other_server():
    """One source for the rollout servers' command line (rl_core.models.vllm_args.rollout_server_args): the
    pod's is the function's, with the run's dtype and context from the ConfigMap (Kubernetes expands
    ``$(VAR)`` from the container's env), so a pod returns the logprobs the trainer expects."""
    from rl_core.models.vllm_args import rollout_server_args

    (vllm,) = _component("rollout")["spec"]["containers"]
    assert vllm["command"] == ["vllm", "serve", "/models/policy"]
    want = rollout_server_args(
        host="0.0.0.0",
        port=8000,
        dtype="$(RLFOUNDRY_ENGINE_DTYPE)",
        max_model_len="$(RLFOUNDRY_MAX_MODEL_LEN)",
    )
    assert vllm["args"] == want
    env = {e["name"]: e for e in vllm["env"]}
    config = next(d for d in _by_kind("ConfigMap") if d["metadata"]["name"] == "rlfoundry-config")["data"]
    for var in ("RLFOUNDRY_ENGINE_DTYPE", "RLFOUNDRY_MAX_MODEL_LEN"):
        ref = env[var]["valueFrom"]["configMapKeyRef"]
        assert ref["name"] == "rlfoundry-config" and ref["key"] in config
    for flag in ("--logprobs-mode", "--dtype", "--max-model-len", "--seed"):
        assert flag in vllm["args"]


def _ray_cluster() -> dict[str, Any]:
    (cluster,) = _by_kind("RayCluster")
    return cluster


def _misspelled_group_field(d: dict[str, Any]) -> None:
    d["spec"]["workerGroupSpecs"][0]["replica"] = 3


def _misspelled_pod_field(d: dict[str, Any]) -> None:
    d["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"


def _start_param_not_a_string(d: dict[str, Any]) -> None:
    d["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0


def _more_replicas_than_the_max(d: dict[str, Any]) -> None:
    d["spec"]["workerGroupSpecs"][0]["replicas"] = 99


@pytest.mark.parametrize(
    "breakage, error",
    [
        (_misspelled_group_field, "'replica' was unexpected"),
        (_misspelled_pod_field, "'imagePullPolicyy' was unexpected"),
        (_start_param_not_a_string, "0 is not of type 'string'"),
        (_more_replicas_than_the_max, "min <= replicas <= max"),
    ],
)
def test_the_ray_cluster_check_rejects_a_broken_cluster(breakage, error):
    """The RayCluster check is not vacuous: a misspelled field of KubeRay's or of the pod template, a
    wrong type, an impossible replica count: each fails, for that reason."""
    broken = copy.deepcopy(_ray_cluster())
    breakage(broken)
    with pytest.raises(Exception) as caught:  # noqa: PT011 (jsonschema's, kubernetes-validate's, an assert)
        check_ray_cluster(broken)
    assert error in str(caught.value)


def test_the_ray_cluster_has_token_auth_on_everywhere_and_its_drivers_have_the_token():
    """Ray 2.58 leaves token authentication off: every Ray container turns it on with the Secret's token,
    the head runs no work, the ports stay internal, the env workers run the sandbox's seccomp profile, the
    GPU workers have GPUs and shared memory, and the Prefect pool's flow-run pods (the drivers) carry the
    same Secret and mode. The version is the one pyproject.toml pins."""
    import tomllib

    from flows.deployments import kubernetes_template

    cluster = _ray_cluster()
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = [
        d
        for d in pins["project"]["dependencies"]
        + sum(pins["project"].get("optional-dependencies", {}).values(), [])
        if d.startswith("ray")
    ]
    assert any(cluster["spec"]["rayVersion"] in d for d in wanted), (cluster["spec"]["rayVersion"], wanted)
    for group, spec in _ray_groups(cluster):
        for c in _containers(spec["template"]):
            env = {e["name"]: e for e in c["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token", f"{group}/{c['name']}"
            ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "rlfoundry-ray-auth", "key": "RAY_AUTH_TOKEN"}, f"{group}/{c['name']}"
        assert spec["template"]["spec"]["automountServiceAccountToken"] is False
    groups = dict(_ray_groups(cluster))
    assert groups["head"]["rayStartParams"]["num-cpus"] == "0"
    assert cluster["spec"]["headGroupSpec"]["serviceType"] == "ClusterIP"
    env_pod = groups["env"]["template"]["spec"]
    profile = env_pod["securityContext"]["seccompProfile"]
    assert (
        profile["type"] == "Localhost"
        and (K8S / "seccomp" / Path(profile["localhostProfile"]).name).is_file()
    )
    (gpu,) = groups["gpu"]["template"]["spec"]["containers"]
    assert int(gpu["resources"]["limits"]["nvidia.com/gpu"]) == int(
        groups["gpu"]["rayStartParams"]["num-gpus"]
    )
    volumes = {v["name"]: v for v in groups["gpu"]["template"]["spec"]["volumes"]}
    shm = {m["mountPath"]: m["name"] for m in gpu["volumeMounts"]}["/dev/shm"]
    assert volumes[shm]["emptyDir"]["medium"] == "Memory"
    labels = groups["head"]["template"]["metadata"]["labels"]
    policies = [p for p in _by_kind("NetworkPolicy") if _selects(_pod_selector(p), labels)]
    assert policies, "a NetworkPolicy guards the Ray pods"
    for p in policies:
        sources = [
            e
            for rule in p["spec"]["ingress"]
            for src in rule["from"]
            for e in src["podSelector"]["matchExpressions"]
        ]
        assert sources and all(set(e["values"]) <= {"flow-run", "ray"} for e in sources), sources

    template = kubernetes_template(_prefect_template())
    pod = template["job_configuration"]["job_manifest"]["spec"]["template"]
    assert {"secretRef": {"name": "rlfoundry-ray-auth", "optional": True}} in pod["spec"]["containers"][0][
        "envFrom"
    ]
    assert template["variables"]["properties"]["env"]["default"]["RAY_AUTH_MODE"] == "token"


def _prefect_template() -> dict[str, Any]:
    """The shape of Prefect's default Kubernetes job template (the parts ``kubernetes_template`` changes)."""
    return {
        "variables": {"properties": {"namespace": {}, "image": {}, "env": {"type": "object"}}},
        "job_configuration": {
            "env": "{{ env }}",
            "job_manifest": {"spec": {"template": {"spec": {"containers": [{"env": "{{ env }}"}]}}}},
        },
    }
