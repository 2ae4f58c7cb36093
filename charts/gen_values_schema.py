"""Generate charts/gemma4-serving/values.schema.json (do not edit the JSON by hand).

    python charts/gen_values_schema.py          # rewrite the schema
    python charts/gen_values_schema.py --check  # exit 1 if the committed schema is stale

Every key of values.yaml must appear here (objects are closed with additionalProperties: false,
so a typo in a user's values fails the install with the key's path). Enums, minimums and patterns
turn bad values into readable errors ("at '/autoscaling/kind': value must be one of ...").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).resolve().parent / "gemma4-serving" / "values.schema.json"

NAME_PATTERN = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$"
SECRET_NAME_PATTERN = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$"
QUANTITY_PATTERN = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$"


def _desc(desc: str | None) -> dict[str, Any]:
    return {"description": desc} if desc else {}


def obj(
    props: dict[str, Any],
    required: tuple[str, ...] | list[str] = (),
    desc: str | None = None,
    addl: bool = False,
    **kw: Any,
) -> dict[str, Any]:
    """A closed object (additionalProperties: false unless addl)."""
    d: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": addl}
    if required:
        d["required"] = list(required)
    d.update(_desc(desc))
    d.update(kw)
    return d


def string(desc: str | None = None, **kw: Any) -> dict[str, Any]:
    return {"type": "string", **_desc(desc), **kw}


def integer(desc: str | None = None, minimum: int = 0, **kw: Any) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, **_desc(desc), **kw}


def boolean(desc: str | None = None) -> dict[str, Any]:
    return {"type": "boolean", **_desc(desc)}


def free(desc: str | None = None) -> dict[str, Any]:
    """A Kubernetes object passed through as is (affinity, behavior, ...)."""
    return {"type": "object", **_desc(desc)}


def array(desc: str | None = None, items: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "array", "items": items or {"type": "object"}, **_desc(desc)}


def strmap(desc: str | None = None) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": {"type": "string"}, **_desc(desc)}


def ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/definitions/{name}"}


DEFINITIONS: dict[str, Any] = {
    "quantity": {
        "description": "A Kubernetes quantity such as 8Gi, 500m or 4",
        "type": ["string", "integer"],
        "pattern": QUANTITY_PATTERN,
    },
    "promDuration": {
        "description": "A Prometheus duration such as 15s or 1m",
        "type": "string",
        "pattern": "^([0-9]+(ms|s|m|h|d|w|y))+$",
    },
    "image": obj(
        {
            "repository": string("Image repository", minLength=1),
            "tag": string("Image tag; empty = the chart's appVersion"),
            "digest": string(
                "sha256:<64 hex> digest; empty = use the tag", pattern="^(sha256:[a-f0-9]{64})?$"
            ),
            "pullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]},
        },
        required=["repository"],
    ),
    "secretRef": obj(
        {
            "existingSecret": string(
                "Name of an existing Secret (values never hold the secret itself)",
                pattern=SECRET_NAME_PATTERN,
            ),
            "key": string("Key inside the Secret", minLength=1),
        },
        required=["existingSecret", "key"],
    ),
    "probe": obj(
        {
            "path": string("HTTP path", pattern="^/"),
            "initialDelaySeconds": integer(),
            "periodSeconds": integer(minimum=1),
            "timeoutSeconds": integer(minimum=1),
            "failureThreshold": integer(minimum=1),
        },
        required=["path", "periodSeconds", "timeoutSeconds", "failureThreshold"],
    ),
    "resources": obj(
        {
            "requests": {"type": "object", "additionalProperties": ref("quantity")},
            "limits": {"type": "object", "additionalProperties": ref("quantity")},
            "claims": array(),
        }
    ),
    # Closed, with string values: `--set tolerations[0].value=true` would otherwise render a YAML
    # boolean the API server rejects only at install time, and a misspelt field would be dropped.
    "toleration": obj(
        {
            "key": string(),
            "operator": {"type": "string", "enum": ["Exists", "Equal"]},
            "value": string("A string: use --set-string for true/false or numbers"),
            "effect": {
                "type": "string",
                "enum": ["", "NoSchedule", "PreferNoSchedule", "NoExecute"],
            },
            "tolerationSeconds": {"type": "integer"},
        }
    ),
    "envList": array(
        "EnvVar objects (use valueFrom.secretKeyRef for secrets)",
        obj({"name": string(minLength=1)}, required=["name"], addl=True),
    ),
}


def loadtest_mode(desc: str, standalone: bool) -> dict[str, Any]:
    props: dict[str, Any] = {
        "enabled": boolean(desc),
        "settings": strmap("SLO_LOADTEST_<KEY> settings (strings) merged over loadtest.settings"),
        "args": array("Extra slo-loadtest run arguments", {"type": ["string", "number"]}),
        "activeDeadlineSeconds": integer("Hard bound on the Job (s)", minimum=60),
        "keepResultsSeconds": integer("Seconds the pod keeps /results after the run"),
    }
    if standalone:
        # an integer too: `--set loadtest.job.runId=$(date +%Y%m%d%H%M)` arrives as a number
        props["runId"] = {
            "type": ["string", "integer"],
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            "maxLength": 20,
            "minimum": 0,
            "description": "Names the standalone Job "
            "(<fullname>-loadtest-<runId>-<pod template hash>): "
            "it runs once per runId and pod template",
        }
        props["ttlSecondsAfterFinished"] = {
            "type": ["integer", "null"],
            "minimum": 0,
            "description": "Delete the finished Job after (s); null = keep it",
        }
    return obj(props, required=["enabled", "activeDeadlineSeconds", "keepResultsSeconds"])


RATIO = {"type": ["string", "number"], "pattern": r"^[0-9]*\.?[0-9]+$"}

VALUES = obj(
    {
        "global": free("Helm global values (unused)"),
        "nameOverride": string(pattern=NAME_PATTERN, maxLength=63),
        "fullnameOverride": string(pattern=NAME_PATTERN, maxLength=63),
        "commonLabels": strmap("Labels added to every object (never to selectors)"),
        "image": ref("image"),
        "imagePullSecrets": array(
            "Image pull Secrets: names, or LocalObjectReference objects ({name: regcred})",
            {
                "oneOf": [
                    string(pattern=SECRET_NAME_PATTERN, minLength=1),
                    obj({"name": string(pattern=SECRET_NAME_PATTERN, minLength=1)}, ["name"]),
                ]
            },
        ),
        "model": obj(
            {"name": string("Model id or path", minLength=1), "hfToken": ref("secretRef")},
            required=["name", "hfToken"],
        ),
        "server": obj(
            {
                "port": integer("Container port", minimum=1, maximum=65535),
                "command": array("Entrypoint of the image", string(minLength=1)) | {"minItems": 1},
                "extraArgs": array(
                    "Extra vLLM flags, one argv word per item",
                    {"type": ["string", "number", "boolean"]},
                ),
                "apiServerCount": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "description": "--api-server-count; null = vLLM's default",
                },
                "maxNumBatchedTokens": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "description": "--max-num-batched-tokens; null = vLLM's default",
                },
                "attentionBackend": {
                    "type": ["string", "null"],
                    "pattern": "^[A-Z][A-Z0-9_]*$",
                    "description": "--attention-backend (a vLLM AttentionBackendEnum name, "
                    "e.g. TRITON_ATTN); null = vLLM's choice",
                },
                "compilationConfig": {
                    "type": ["object", "null"],
                    "description": "vLLM's --compilation-config as a map (one JSON argument); "
                    "null = vLLM's default ({} merges with the chart's keys and keeps them)",
                },
                "apiKey": ref("secretRef"),
                "pluginEnv": {
                    "type": "object",
                    "propertyNames": {"pattern": "^GEMMA4_[A-Z0-9_]+$"},
                    "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
                    "description": "The plugin's switches (GEMMA4_*), one env var each; "
                    "rendered as strings, null drops a default",
                },
                "warmup": obj(
                    {
                        "enabled": boolean("Warm up before Ready (startup probe waits for it)"),
                        "args": string("Options of python -m gemma4_batched_encoder.warmup"),
                    },
                    required=["enabled"],
                ),
                "extraEnv": ref("envList"),
                "envFrom": array("EnvFromSource objects (configMapRef / secretRef)"),
                "extraVolumeMounts": array(
                    "VolumeMount objects of the vLLM container",
                    obj(
                        {"name": string(minLength=1), "mountPath": string(pattern="^/")},
                        required=["name", "mountPath"],
                        addl=True,
                    ),
                ),
                "shmSizeLimit": ref("quantity"),
                "preStopSleepSeconds": integer("preStop sleep (s); 0 = none"),
            },
            required=["port", "command", "apiKey"],
        ),
        "extraVolumes": array(
            "Pod Volume objects",
            obj({"name": string(minLength=1)}, required=["name"], addl=True),
        ),
        "initContainers": array(
            "Init Container objects",
            obj({"name": string(minLength=1)}, required=["name"], addl=True),
        ),
        "extraContainers": array(
            "Sidecar Container objects",
            obj({"name": string(minLength=1)}, required=["name"], addl=True),
        ),
        "replicaCount": integer("Replicas when autoscaling is off"),
        "progressDeadlineSeconds": {
            "type": ["integer", "null"],
            "minimum": 1,
            "description": "Deployment progress deadline (s); null = startup budget + 600",
        },
        "strategy": obj(
            {
                "type": {"type": "string", "enum": ["RollingUpdate", "Recreate"]},
                "rollingUpdate": free(),
            },
            desc="{} = Recreate with a created ReadWriteOnce model cache, RollingUpdate else",
        ),
        "resources": ref("resources"),
        "nodeSelector": strmap(),
        "tolerations": array(items=ref("toleration")),
        "affinity": free(),
        "topologySpreadConstraints": array(),
        "runtimeClassName": string(),
        "priorityClassName": string(),
        "terminationGracePeriodSeconds": integer(),
        "podAnnotations": strmap(),
        "podLabels": strmap(),
        "serviceAccount": obj({"create": boolean(), "name": string(), "annotations": strmap()}),
        "podSecurityContext": obj(
            {
                "runAsNonRoot": {"const": True, "description": "must stay true: non-root only"},
                "runAsUser": integer("non-root uid (not 0)", minimum=1),
            },
            addl=True,
        ),
        "securityContext": obj(
            {
                "runAsNonRoot": {"const": True, "description": "must stay true"},
                "allowPrivilegeEscalation": {"const": False, "description": "must stay false"},
                "privileged": {"const": False, "description": "must stay false"},
                "readOnlyRootFilesystem": boolean(),
                "capabilities": free(),
            },
            required=["allowPrivilegeEscalation", "capabilities"],
            addl=True,
        ),
        "modelCache": obj(
            {
                "enabled": boolean(),
                "existingClaim": string(),
                "size": ref("quantity"),
                "storageClassName": string(),
                "accessModes": array(
                    items={
                        "type": "string",
                        "enum": [
                            "ReadWriteOnce",
                            "ReadWriteMany",
                            "ReadOnlyMany",
                            "ReadWriteOncePod",
                        ],
                    }
                )
                | {"minItems": 1},
                "keep": boolean(),
                "podsOnOneNode": boolean(
                    "All pods pinned to one node: a created ReadWriteOnce claim may serve several"
                ),
                "mountPath": string(pattern="^/"),
            },
            required=["enabled", "mountPath"],
        ),
        "probes": obj(
            {k: ref("probe") for k in ("startup", "readiness", "liveness")},
            required=["startup", "readiness", "liveness"],
        ),
        "service": obj(
            {
                "type": {"type": "string", "enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                "port": integer(minimum=1, maximum=65535),
                "annotations": strmap(),
            },
            required=["type", "port"],
        ),
        "ingress": obj(
            {
                "enabled": boolean(),
                "className": string(pattern=NAME_PATTERN),
                "annotations": strmap(),
                "hosts": {
                    "type": "array",
                    "minItems": 1,
                    "items": obj(
                        {
                            "host": string("DNS name; empty = any host"),
                            "paths": {
                                "type": "array",
                                "minItems": 1,
                                "items": obj(
                                    {
                                        "path": string(pattern="^/"),
                                        "pathType": {
                                            "type": "string",
                                            "enum": ["Prefix", "Exact", "ImplementationSpecific"],
                                        },
                                    },
                                    required=["path", "pathType"],
                                ),
                            },
                        },
                        required=["paths"],
                    ),
                },
                "tls": array(
                    items=obj(
                        {
                            "hosts": array(items={"type": "string"}),
                            "secretName": string(pattern=SECRET_NAME_PATTERN),
                        },
                        required=["secretName"],
                    )
                ),
            },
            required=["enabled"],
        ),
        "httpRoute": obj(
            {
                "enabled": boolean(),
                "parentRefs": array(
                    items=obj(
                        {
                            "group": string(),
                            "kind": string(),
                            "name": string(pattern=SECRET_NAME_PATTERN, minLength=1),
                            "namespace": string(pattern=NAME_PATTERN),
                            "sectionName": string(pattern=SECRET_NAME_PATTERN),
                            "port": integer(minimum=1, maximum=65535),
                        },
                        required=["name"],
                    )
                ),
                "hostnames": array(items={"type": "string"}),
                "pathPrefixes": {
                    "type": "array",
                    "minItems": 1,
                    "items": string(pattern="^/"),
                },
                "timeouts": obj(
                    {
                        "request": string(pattern=r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"),
                        "backendRequest": string(pattern=r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"),
                    }
                ),
                "annotations": strmap(),
            },
            required=["enabled"],
        ),
        "podDisruptionBudget": obj(
            {
                "enabled": boolean(),
                "maxUnavailable": {
                    "type": ["integer", "string", "null"],
                    "minimum": 0,
                    "pattern": "^[0-9]+%$",
                },
                "minAvailable": {
                    "type": ["integer", "string", "null"],
                    "minimum": 0,
                    "pattern": "^[0-9]+%$",
                },
            }
        ),
        "networkPolicy": obj(
            {
                "enabled": boolean(),
                "ingressFrom": array(),
                "metricsNamespaceSelector": free(),
                "restrictEgress": boolean(),
                "extraEgress": array(),
            }
        ),
        "metrics": obj(
            {
                "mode": {
                    "type": "string",
                    "enum": ["auto", "serviceMonitor", "annotations", "none"],
                    "description": "auto | serviceMonitor | annotations | none",
                },
                "path": string(pattern="^/"),
                "serviceMonitor": obj(
                    {
                        "additionalLabels": strmap(),
                        "namespace": string(),
                        "interval": ref("promDuration"),
                        "scrapeTimeout": ref("promDuration"),
                        "relabelings": array(),
                        "metricRelabelings": array(),
                        "podTargetLabels": array(items=string()),
                    }
                ),
                "prometheusRule": obj(
                    {
                        "enabled": {
                            "enum": ["auto", True, False],
                            "description": "auto|true|false",
                        },
                        "additionalLabels": strmap(),
                        "namespace": string(),
                        "runbookUrl": string(
                            "runbook page each alert links to (#<alert name> appended); "
                            "empty: the runbooks.md the rules were generated with",
                            pattern="^(https?://[^#\\s]+)?$",
                        ),
                    }
                ),
            },
            required=["mode"],
        ),
        "dashboards": obj(
            {
                "enabled": boolean(),
                "label": string(minLength=1),
                "labelValue": string(),
                "namespace": string(),
                "folder": string(),
                "annotations": strmap(),
            }
        ),
        "autoscaling": obj(
            {
                "enabled": boolean(),
                "kind": {"type": "string", "enum": ["hpa", "keda"], "description": "hpa | keda"},
                "minReplicas": integer(minimum=1),
                "maxReplicas": integer(minimum=1),
                "targetPerPod": RATIO
                | {
                    "description": "Per-pod capacity in the load signal's unit (in-flight requests)"
                },
                "behavior": free("HPA behavior"),
                "keda": obj(
                    {
                        "serverAddress": string(
                            "Prometheus URL KEDA queries", pattern="^(https?://.+)?$"
                        ),
                        "query": string(
                            "Load query, the release's total (tpl-rendered)", minLength=1
                        ),
                        "activationThreshold": RATIO,
                        "pollingInterval": integer(minimum=1),
                        "cooldownPeriod": integer(),
                        "authenticationRef": string(),
                        "extraMetadata": strmap(),
                        "sloTrigger": obj(
                            {
                                "enabled": boolean("Extra scale-up trigger on the SLO ratio"),
                                "query": string("SLO-violation share (tpl-rendered)", minLength=1),
                                "threshold": RATIO,
                            },
                            required=["enabled"],
                        ),
                    }
                ),
                "hpa": obj(
                    {
                        "metricType": {"type": "string", "enum": ["External", "Pods"]},
                        "metricName": string(minLength=1),
                        "selector": free(),
                    }
                ),
            },
            required=["enabled", "kind", "minReplicas", "maxReplicas"],
            **{
                # KEDA needs the Prometheus address: no silent default (see the chart README)
                "if": {"properties": {"enabled": {"const": True}, "kind": {"const": "keda"}}},
                "then": {
                    "properties": {
                        "keda": {
                            "required": ["serverAddress"],
                            "properties": {"serverAddress": {"minLength": 1}},
                        }
                    }
                },
            },
        ),
        "loadtest": obj(
            {
                "image": ref("image"),
                "settings": strmap("SLO_LOADTEST_<KEY> settings (strings) for both Jobs"),
                # keys slo-loadtest sets itself are refused by _loadtest.tpl (a readable message;
                # helm's schema errors for propertyNames name the wrong path)
                "extraBody": free(
                    "JSON object merged into every request body of both Jobs "
                    "(SLO_LOADTEST_EXTRA_BODY), e.g. {skip_special_tokens: false}"
                ),
                "job": loadtest_mode("Render the standalone load-test Job", standalone=True),
                "helmTest": loadtest_mode("Render the helm test hook Job", standalone=False),
                "healthWaitSeconds": integer(
                    "Seconds the Jobs wait for the server's /health (HEALTH_WAIT_SECONDS)",
                    minimum=1,
                ),
                "extraEnv": ref("envList"),
                "results": obj(
                    {
                        "persistence": obj(
                            {
                                "enabled": boolean(),
                                "existingClaim": string(),
                                "size": ref("quantity"),
                                "storageClassName": string(),
                            }
                        )
                    }
                ),
                "resources": ref("resources"),
                "nodeSelector": strmap(),
                "tolerations": array(items=ref("toleration")),
                "affinity": free(),
            }
        ),
    }
)


def schema() -> dict[str, Any]:
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "gemma4-serving values (generated by charts/gen_values_schema.py)",
        "definitions": DEFINITIONS,
        **VALUES,
    }


def main(argv: list[str]) -> int:
    text = json.dumps(schema(), indent=2) + "\n"
    if "--check" in argv:
        if SCHEMA_PATH.read_text() != text:
            print(f"{SCHEMA_PATH} is stale: run python charts/gen_values_schema.py")
            return 1
        return 0
    SCHEMA_PATH.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
