"""Our own JSON schemas (draft 2020-12) of the custom resources in deploy/kubernetes, covering only the fields those
manifests use, written from each project's documented API (not taken from its CustomResourceDefinition):

- LeaderWorkerSet `leaderworkerset.x-k8s.io/v1`: the LWS documentation (lws.sigs.k8s.io/docs: concepts, startup
  policy, failure handling and restart policies);
- PodMonitor `monitoring.coreos.com/v1`: the Prometheus Operator's API reference (PodMonitorSpec, PodMetricsEndpoint)
  and Prometheus' duration format;
- ScaledObject `keda.sh/v1alpha1`: KEDA's ScaledObject specification and its Prometheus scaler page;
- InferencePool `inference.networking.k8s.io/v1`: the Gateway API Inference Extension's API reference;
- HTTPRoute `gateway.networking.k8s.io/v1`: the Gateway API's API reference.

Every object level we fill in says additionalProperties: false, so a misspelt or unknown field fails (a manifest
that starts to use another documented field must add it here first). Where a custom resource embeds a Kubernetes
type (its metadata, LeaderWorkerSet's pod templates, PodMonitor's label selector, the behavior KEDA hands to its
HorizontalPodAutoscaler) the schema refers to that type's definition in the core Kubernetes schema that
kubernetes-validate ships (`core(...)`, resolved by tests/deploy/test_kubernetes_schemas.py), so those parts are
checked as strictly as the Kubernetes kinds are: container specs, probes, volumes and all.

This is not the whole CRD: `kubectl apply --dry-run=server` against a cluster with the CRDs installed is the full
check (docs/DEPLOY.md)."""

# The $id of kubernetes-validate's _definitions.json, for every Kubernetes version it ships.
CORE = "https://kubernetes.io/api/_definitions.json"


def core(definition: str) -> dict:
    """A reference to a definition of the core Kubernetes schema, e.g. io.k8s.api.core.v1.PodTemplateSpec."""
    return {"$ref": f"{CORE}#/$defs/{definition}"}


def obj(properties: dict, required=()) -> dict:
    """An object with these fields and no others."""
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def array(items: dict) -> dict:
    return {"type": "array", "items": items, "minItems": 1}


def integer(minimum: int) -> dict:
    return {"type": "integer", "minimum": minimum, "maximum": 2**31 - 1}  # the API's int32


def resource(api_version: str, kind: str, spec: dict) -> dict:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            **obj({"apiVersion": {"const": api_version}, "kind": {"const": kind},
                   "metadata": core("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"), "spec": spec},
                  required=("apiVersion", "kind", "metadata", "spec"))}


NAME = {"type": "string", "minLength": 1}
POD_TEMPLATE = core("io.k8s.api.core.v1.PodTemplateSpec")

# LeaderWorkerSet: `replicas` groups of `size` pods, pod 0 from leaderTemplate (else workerTemplate), the others from
# workerTemplate. startupPolicy: create the workers with the leader pod (LeaderCreated, the default) or once it is
# ready (LeaderReady). restartPolicy: on a pod's failure recreate the whole group (RecreateGroupOnPodRestart, the
# default), recreate it only when none of its pods is pending (RecreateGroupAfterStart, LWS 0.9+), or restart just
# that pod (None).
LEADER_WORKER_SET = resource("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", obj({
    "replicas": integer(0),
    "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
    "leaderWorkerTemplate": obj({
        "size": integer(1),
        "restartPolicy": {"enum": ["RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"]},
        "leaderTemplate": POD_TEMPLATE,
        "workerTemplate": POD_TEMPLATE,
    }, required=("workerTemplate",)),
}, required=("leaderWorkerTemplate",)))

# A Prometheus duration: units from years to milliseconds, largest first, each at most once, or 0 (e.g. 15s, 1m30s).
PROMETHEUS_DURATION = {"type": "string", "minLength": 1,
                       "pattern": r"^(0|([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?)$"}

# PodMonitor: scrape the pods the selector matches, at each endpoint (a named container port and a path), copying
# the pod labels podTargetLabels names onto the series.
POD_MONITOR = resource("monitoring.coreos.com/v1", "PodMonitor", obj({
    "selector": core("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"),
    "podTargetLabels": array(NAME),
    "podMetricsEndpoints": array(obj({
        "port": NAME,
        "path": {"type": "string", "pattern": "^/"},
        "interval": PROMETHEUS_DURATION,
    }, required=("port",))),
}, required=("selector", "podMetricsEndpoints")))

# ScaledObject: KEDA scales scaleTargetRef between minReplicaCount and maxReplicaCount, polling its triggers every
# pollingInterval seconds, through an HPA it makes with advanced.horizontalPodAutoscalerConfig.behavior (the
# autoscaling/v2 type). A trigger's metadata is a map of strings; the prometheus scaler's: the server, a query that
# returns one value, and the target value per replica.
SCALED_OBJECT = resource("keda.sh/v1alpha1", "ScaledObject", obj({
    "scaleTargetRef": obj({"apiVersion": NAME, "kind": NAME, "name": NAME}, required=("name",)),
    "minReplicaCount": integer(0),
    "maxReplicaCount": integer(1),
    "pollingInterval": integer(1),
    "cooldownPeriod": integer(0),
    "advanced": obj({
        "horizontalPodAutoscalerConfig": obj({
            "behavior": core("io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerBehavior"),
        }),
    }),
    "triggers": array(obj({
        "type": {"const": "prometheus"},
        "metadata": obj({
            "serverAddress": {"type": "string", "pattern": "^https?://[^/]+"},
            "query": NAME,
            "threshold": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
        }, required=("serverAddress", "query", "threshold")),
    }, required=("type", "metadata"))),
}, required=("scaleTargetRef", "triggers")))

PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
DNS_LABEL = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}

# InferencePool: the Gateway API Inference Extension's pool of model-server pods (its API reference and
# api/v1/inferencepool_types.go): the pods it selects by labels alone (matchLabels, as a Service's selector), the
# one port (v1 allows one) requests go to, and the endpoint picker: a Service's name and port (required for a
# Service), and whether the gateway routes anyway (FailOpen) or refuses (FailClose) when the picker does not answer.
INFERENCE_POOL = resource("inference.networking.k8s.io/v1", "InferencePool", obj({
    "selector": obj({"matchLabels": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}}},
                    required=("matchLabels",)),
    "targetPorts": {**array(obj({"number": PORT}, required=("number",))), "maxItems": 1},
    "endpointPickerRef": obj({
        "group": {"type": "string"},
        "kind": NAME,
        "name": DNS_LABEL,
        "port": obj({"number": PORT}, required=("number",)),
        "failureMode": {"enum": ["FailOpen", "FailClose"]},
    }, required=("name",)),
}, required=("selector", "targetPorts", "endpointPickerRef")))

# HTTPRoute `gateway.networking.k8s.io/v1` (the Gateway API's reference): the Gateways it attaches to (parentRefs),
# and rules, each matching requests (a path: Exact, PathPrefix or RegularExpression) and naming the backends that
# take them (a Service, or another kind by group and kind: here the InferencePool), with timeouts in the Gateway
# API's duration format.
GATEWAY_DURATION = {"type": "string", "pattern": "^([0-9]{1,5}(h|m|s|ms)){1,4}$"}
HTTP_ROUTE = resource("gateway.networking.k8s.io/v1", "HTTPRoute", obj({
    "parentRefs": array(obj({"group": {"type": "string"}, "kind": NAME, "namespace": DNS_LABEL, "name": NAME,
                             "sectionName": DNS_LABEL, "port": PORT}, required=("name",))),
    "hostnames": array({"type": "string"}),
    "rules": array(obj({
        "matches": array(obj({
            "path": obj({"type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]},
                         "value": {"type": "string", "pattern": "^/", "maxLength": 1024}}),
        })),
        "backendRefs": array(obj({"group": {"type": "string"}, "kind": NAME, "name": NAME, "namespace": DNS_LABEL,
                                  "port": PORT, "weight": {"type": "integer", "minimum": 0, "maximum": 1000000}},
                                 required=("name",))),
        "timeouts": obj({"request": GATEWAY_DURATION, "backendRequest": GATEWAY_DURATION}),
    })),
}, required=()))

SCHEMAS = {("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): LEADER_WORKER_SET,
           ("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR,
           ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT,
           ("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL,
           ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTP_ROUTE}
