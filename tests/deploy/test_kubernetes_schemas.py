"""Every object of deploy/kubernetes validates offline: the Kubernetes kinds with kubernetes-validate (strict: an
unknown field is an error, as `kubectl apply --validate=strict`), the custom resources against our own schemas of the
fields they use (tests/deploy/crd_fields.py), whose embedded Kubernetes types (metadata, LeaderWorkerSet's pod
templates, PodMonitor's selector, the HPA behavior of a ScaledObject) refer to the core Kubernetes definitions that
kubernetes-validate ships, strict too. A broken copy of each kind fails, so the validation bites."""
import copy
import functools
import importlib.resources
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
from referencing import Registry, Resource

from tests.deploy.crd_fields import CORE, SCHEMAS
from tests.deploy.kube import REPO, objects

VERSIONS = ("1.29.0", "1.37.0")  # the oldest Kubernetes release these manifests claim, and the newest known


@functools.cache
def core_definitions(version: str) -> dict:
    """kubernetes-validate's strict definitions of every Kubernetes type for this version (those its strict
    validation of a kind refers to), as installed, never copied into this repository."""
    assert version in kubernetes_validate.utils.all_versions(), version
    path = importlib.resources.files("kubernetes_validate").joinpath(
        "kubernetes-json-schema", f"v{version}-local-strict", "_definitions.json")
    definitions = json.loads(path.read_text())
    assert definitions["$id"] == CORE, definitions["$id"]
    return definitions


@functools.cache
def crd_validator(api_version: str, kind: str, version: str) -> jsonschema.Draft202012Validator:
    registry = Registry().with_resource(CORE, Resource.from_contents(core_definitions(version)))
    return jsonschema.Draft202012Validator(SCHEMAS[api_version, kind], registry=registry)


def validate(doc: dict) -> None:
    """Raises a ValidationError (jsonschema's or kubernetes-validate's) for an invalid object."""
    for version in VERSIONS:
        if (doc["apiVersion"], doc["kind"]) in SCHEMAS:
            crd_validator(doc["apiVersion"], doc["kind"], version).validate(doc)
        else:
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("path,doc", objects(), ids=lambda x: str(x.relative_to(REPO)) if isinstance(x, Path)
                         else f"{x['kind']}/{x['metadata']['name']}")
def test_the_object_validates(path, doc):
    validate(doc)


def test_every_kind_is_one_these_tests_validate():
    kinds = {(doc["apiVersion"], doc["kind"]) for _, doc in objects()}
    assert set(SCHEMAS) <= kinds  # each of our schemas is used
    for api_version, kind in kinds - set(SCHEMAS):  # the rest are Kubernetes' own, which kubernetes-validate knows
        assert "/" not in api_version or api_version.split("/")[0] in ("apps", "autoscaling", "policy"), kind


def walk(schema, path="$"):
    if isinstance(schema, dict):
        yield path, schema
        for key, value in schema.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from walk(value, f"{path}[{i}]")


@pytest.mark.parametrize("key", SCHEMAS, ids=lambda key: key[1])
def test_our_schemas_refuse_unknown_fields_and_refer_to_core_types_that_exist(key):
    for path, node in walk(SCHEMAS[key]):
        if "properties" in node:
            assert node.get("additionalProperties") is False, path
        if "$ref" in node:
            for version in VERSIONS:
                base, _, pointer = node["$ref"].partition("#/$defs/")
                assert base == CORE and pointer in core_definitions(version)["$defs"], (path, version)


def test_a_leaderworkersets_pod_templates_are_core_pod_template_specs():
    spec = SCHEMAS["leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"]["properties"]["spec"]
    group = spec["properties"]["leaderWorkerTemplate"]["properties"]
    for template in ("leaderTemplate", "workerTemplate"):
        assert group[template] == {"$ref": f"{CORE}#/$defs/io.k8s.api.core.v1.PodTemplateSpec"}


def first(kind: str) -> dict:
    return copy.deepcopy(next(doc for _, doc in objects() if doc["kind"] == kind))


WORKER, LEADER = "spec/leaderWorkerTemplate/workerTemplate/spec", "spec/leaderWorkerTemplate/leaderTemplate/spec"
BEHAVIOR = "spec/advanced/horizontalPodAutoscalerConfig/behavior"


def broken_copies():
    """(what, the broken copy, the path of the error it must fail with)"""
    deployment = first("Deployment")
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 45  # a misspelled field
    yield "Deployment with an unknown field", deployment, "spec/template/spec"
    service = first("Service")
    service["spec"]["ports"][0]["port"] = "http"  # a port must be a number
    yield "Service with a named port", service, "spec/ports/0/port"

    group = first("LeaderWorkerSet")
    group["spec"]["replcas"] = 1  # a misspelled key under spec
    yield "LeaderWorkerSet with a misspelled spec field", group, "spec"
    group = first("LeaderWorkerSet")
    group["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "RecreateGroupOnRestart"  # not one of the enum
    yield "LeaderWorkerSet with an unknown restart policy", group, "spec/leaderWorkerTemplate/restartPolicy"
    group = first("LeaderWorkerSet")
    group["spec"]["startupPolicy"] = "LeaderStarted"
    yield "LeaderWorkerSet with an unknown startup policy", group, "spec/startupPolicy"
    group = first("LeaderWorkerSet")
    group["spec"]["leaderWorkerTemplate"]["size"] = 0
    yield "LeaderWorkerSet with groups of 0 pods", group, "spec/leaderWorkerTemplate/size"
    group = first("LeaderWorkerSet")
    group["spec"]["leaderWorkerTemplate"]["groupSize"] = 2  # not a field of LeaderWorkerTemplate
    yield "LeaderWorkerSet with an unknown field", group, "spec/leaderWorkerTemplate"
    group = first("LeaderWorkerSet")
    group["metadata"]["lables"] = {"app": "tinyvllm"}
    yield "LeaderWorkerSet with misspelled metadata", group, "metadata"
    group = first("LeaderWorkerSet")  # the pod templates against core PodTemplateSpec:
    group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["argz"] = []
    yield "LeaderWorkerSet worker with an unknown container field", group, f"{WORKER}/containers/0"
    group = first("LeaderWorkerSet")
    group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["livenessProbe"] = {
        "httpGet": {"path": "/health", "port": "http"}, "periodSeconds": "10s"}  # an int32
    yield "LeaderWorkerSet worker with an invalid probe", group, f"{WORKER}/containers/0/livenessProbe/periodSeconds"
    group = first("LeaderWorkerSet")
    group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["readinessProbe"] = {
        "httpGet": {"path": "/health"}}  # no port
    yield "LeaderWorkerSet worker probe without a port", group, f"{WORKER}/containers/0/readinessProbe/httpGet"
    group = first("LeaderWorkerSet")
    probe = group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["startupProbe"]
    probe["failureTreshold"] = 3
    yield "LeaderWorkerSet leader probe misspelled", group, f"{LEADER}/containers/0/startupProbe"
    group = first("LeaderWorkerSet")
    volume = group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["volumes"][-1]
    volume["persistentVolumeClaim"]["claimname"] = "models"
    yield "LeaderWorkerSet worker volume misspelled", group, f"{WORKER}/volumes/2/persistentVolumeClaim"

    monitor = first("PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"  # not a Prometheus duration
    yield "PodMonitor with a bad interval", monitor, "spec/podMetricsEndpoints/0/interval"
    monitor = first("PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["scrapeInterval"] = "15s"
    yield "PodMonitor with an unknown endpoint field", monitor, "spec/podMetricsEndpoints/0"
    monitor = first("PodMonitor")
    monitor["spec"]["selector"]["matchLabel"] = {"app": "tinyvllm"}  # core LabelSelector
    yield "PodMonitor with a misspelled selector", monitor, "spec/selector"

    scaled = first("ScaledObject")
    del scaled["spec"]["scaleTargetRef"]  # required
    yield "ScaledObject without a target", scaled, "spec"
    scaled = first("ScaledObject")
    scaled["spec"]["minReplicas"] = 1  # the HPA's name, not KEDA's
    yield "ScaledObject with a misspelled spec field", scaled, "spec"
    scaled = first("ScaledObject")
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 8  # metadata values are strings
    yield "ScaledObject with a number for a threshold", scaled, "spec/triggers/0/metadata/threshold"
    scaled = first("ScaledObject")
    scaled["spec"]["triggers"][0]["type"] = "prometheus-adapter"
    yield "ScaledObject with another trigger type", scaled, "spec/triggers/0/type"
    pool = first("InferencePool")
    pool["spec"]["targetPorts"].append({"number": 8001})  # v1 takes one port
    yield "InferencePool with two target ports", pool, "spec/targetPorts"
    pool = first("InferencePool")
    pool["spec"]["selector"]["matchExpressions"] = []  # labels only, unlike a core LabelSelector
    yield "InferencePool with a set-based selector", pool, "spec/selector"
    pool = first("InferencePool")
    pool["spec"]["endpointPickerRef"]["failureMode"] = "FailClosed"
    yield "InferencePool with an unknown failure mode", pool, "spec/endpointPickerRef/failureMode"
    route = first("HTTPRoute")
    route["spec"]["rules"][0]["timeouts"]["request"] = "10 minutes"  # not a Gateway API duration
    yield "HTTPRoute with a bad timeout", route, "spec/rules/0/timeouts/request"
    route = first("HTTPRoute")
    route["spec"]["rules"][0]["backendRef"] = route["spec"]["rules"][0].pop("backendRefs")
    yield "HTTPRoute with a misspelled rule field", route, "spec/rules/0"

    scaled = first("ScaledObject")
    policy = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]["policies"][0]
    policy["periodSecond"] = 60  # core HorizontalPodAutoscalerBehavior
    yield "ScaledObject with a misspelled HPA behavior field", scaled, f"{BEHAVIOR}/scaleUp/policies/0"


@pytest.mark.parametrize("what,doc,where", list(broken_copies()), ids=[what for what, _, _ in broken_copies()])
def test_a_broken_copy_fails(what, doc, where):
    """It fails, and at the field that was broken (not for some other reason)."""
    with pytest.raises(jsonschema.ValidationError) as error:
        validate(doc)
    assert "/".join(map(str, error.value.absolute_path)) == where, error.value.message
