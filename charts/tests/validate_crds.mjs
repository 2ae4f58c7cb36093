// Validate custom resources (ServiceMonitor, PrometheusRule, PodMonitor, ScaledObject,
// TriggerAuthentication, HTTPRoute) against the schemas generated from the projects' CRDs,
// shipped in the npm packages @kubernetes-models/prometheus-operator, @kubernetes-models/keda and
// @kubernetes-models/gateway-api (installed into .tools/node by scripts/install-tools.sh).
//
// Usage: node validate_crds.mjs FILE.yaml...   (multi-document YAML files)
// Prints one JSON object: {FILE: {"checked": [{"kind", "name"}], "errors": [{"kind", "name",
// "error"}], "unknown": [{"apiVersion", "kind", "name"}]}}. Exit code 0 even with errors (the
// caller asserts); 2 on bad usage. One process for all files: loading the models takes ~2 s.
// These schemas do not reject unknown fields: charts/tests assert the fields it renders.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const nodeDir = process.env.TOOLS_NODE_DIR;
if (!nodeDir) {
  console.error("TOOLS_NODE_DIR is not set (expected .tools/node)");
  process.exit(2);
}
// The packages export ESM only; import their files by path (their own imports then resolve
// from .tools/node/node_modules).
const load = async (file) => import(pathToFileURL(join(nodeDir, "node_modules", file)).href);

const yaml = await load("js-yaml/dist/js-yaml.mjs");
const monitoring = await load(
  "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/index.js",
);
const keda = await load("@kubernetes-models/keda/keda.sh/v1alpha1/index.js");
const gateway = await load("@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/index.js");

const models = {
  "monitoring.coreos.com/v1/ServiceMonitor": monitoring.ServiceMonitor,
  "monitoring.coreos.com/v1/PodMonitor": monitoring.PodMonitor,
  "monitoring.coreos.com/v1/PrometheusRule": monitoring.PrometheusRule,
  "keda.sh/v1alpha1/ScaledObject": keda.ScaledObject,
  "keda.sh/v1alpha1/TriggerAuthentication": keda.TriggerAuthentication,
  "gateway.networking.k8s.io/v1/HTTPRoute": gateway.HTTPRoute,
};

function check(text) {
  const out = { checked: [], errors: [], unknown: [] };
  for (const doc of yaml.loadAll(text)) {
    if (!doc || typeof doc !== "object") continue;
    const key = `${doc.apiVersion}/${doc.kind}`;
    const name = doc.metadata?.name ?? "";
    const Model = models[key];
    if (!Model) {
      out.unknown.push({ apiVersion: doc.apiVersion, kind: doc.kind, name });
      continue;
    }
    out.checked.push({ kind: doc.kind, name });
    try {
      new Model(doc).validate();
    } catch (err) {
      out.errors.push({ kind: doc.kind, name, error: String(err?.message ?? err) });
    }
  }
  return out;
}

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node validate_crds.mjs FILE.yaml...");
  process.exit(2);
}
const result = {};
for (const file of files) result[file] = check(readFileSync(file, "utf8"));
console.log(JSON.stringify(result));
