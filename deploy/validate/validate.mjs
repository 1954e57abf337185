// Offline validation of Kubernetes manifests (no API server):
//   * every document against its schema: kubernetes-models (core/apps/policy),
//     @kubernetes-models/prometheus-operator (ServiceMonitor, PrometheusRule), and the
//     LeaderWorkerSet CRD schema (leaderworkerset.schema.json) with both pod templates checked as
//     core/v1 PodTemplateSpec;
//   * cross-resource rules the schemas cannot see: Service target ports and ServiceMonitor ports
//     exist, selectors match pod labels, gRPC probes are present, the termination grace period
//     exceeds the node's drain timeout, images are pinned, GPU pods get /dev/shm.
//   node validate.mjs FILE.yaml...        (rendered overlays or raw resource files)
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import yaml from 'js-yaml';
import Ajv from 'ajv';
import { PodTemplateSpec } from 'kubernetes-models/v1/PodTemplateSpec';

const here = path.dirname(fileURLToPath(import.meta.url));
const ajv = new Ajv({ allErrors: true, strict: false });
const validateLws = ajv.compile(JSON.parse(fs.readFileSync(path.join(here, 'leaderworkerset.schema.json'), 'utf8')));
let failures = 0;
const fail = (where, msg) => { failures++; console.log(`FAIL ${where}: ${msg}`); };

async function schemaCheck(doc, where) {
  const { apiVersion = '', kind = '' } = doc;
  if (kind === 'LeaderWorkerSet') {
    if (!validateLws(doc)) fail(where, ajv.errorsText(validateLws.errors));
    const t = doc.spec?.leaderWorkerTemplate ?? {};
    for (const which of ['leaderTemplate', 'workerTemplate']) {
      if (t[which] === undefined) continue;
      try { new PodTemplateSpec(t[which]).validate(); } catch (e) { fail(`${where} ${which}`, e.message.split('\n')[0]); }
    }
    return;
  }
  if (kind === 'Kustomization') return;
  const [g, v] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
  const mod = g === 'monitoring.coreos.com'
    ? `@kubernetes-models/prometheus-operator/${g}/${v}/${kind}`
    : `kubernetes-models/${g ? g + '/' : ''}${v}/${kind}`;
  let Model;
  try { Model = (await import(mod))[kind]; } catch { fail(where, `no schema for ${apiVersion} ${kind}`); return; }
  try { new Model(doc).validate(); } catch (e) { fail(where, e.message.split('\n')[0]); }
}

const podTemplates = (doc) => {
  if (doc.kind === 'StatefulSet' || doc.kind === 'Deployment') return [doc.spec.template];
  if (doc.kind === 'LeaderWorkerSet') {
    const t = doc.spec.leaderWorkerTemplate;
    return [t.leaderTemplate, t.workerTemplate].filter(Boolean);
  }
  return [];
};
const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => (labels ?? {})[k] === v);
const seconds = (s) => Number(String(s).replace(/s$/, ''));

const docs = [];
for (const file of process.argv.slice(2)) {
  yaml.loadAll(fs.readFileSync(file, 'utf8')).forEach((doc, i) => {
    if (doc) docs.push({ doc, where: `${file}#${i} ${doc.kind}/${doc.metadata?.name}` });
  });
}
for (const { doc, where } of docs) {
  await schemaCheck(doc, where);
  if (!/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(doc.metadata?.name ?? '')) fail(where, 'bad metadata.name');
}

// Cross-resource checks (within each rendered file set).
const all = docs.map((d) => d.doc);
const templates = all.flatMap((d) => podTemplates(d).map((t) => ({ t, owner: d })));
let drainTimeout = null;
for (const d of all) {
  if (d.kind !== 'ConfigMap' || !d.data) continue;
  for (const text of Object.values(d.data)) {
    const m = /^\s*drain-timeout\s*=\s*([0-9.]+)/m.exec(text);
    if (m) drainTimeout = Number(m[1]);
  }
}
for (const { t, owner } of templates) {
  const where = `${owner.kind}/${owner.metadata.name}`;
  const spec = t.spec ?? {};
  for (const c of spec.containers ?? []) {
    if (!c.image || /:latest$/.test(c.image) || !c.image.includes(':')) fail(where, `image ${c.image} is not pinned`);
    const serves = (c.args ?? []).includes('serve');
    if (serves) {
      for (const p of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
        if (!c[p]?.grpc) fail(where, `${c.name}: ${p} must be a gRPC (grpc.health.v1) probe`);
      }
      if (c.livenessProbe?.grpc?.service !== 'liveness') fail(where, 'liveness must ask for service "liveness"');
      if (drainTimeout !== null && !(seconds(spec.terminationGracePeriodSeconds ?? 30) > drainTimeout)) {
        fail(where, `terminationGracePeriodSeconds ${spec.terminationGracePeriodSeconds} must exceed drain-timeout ${drainTimeout}`);
      }
    }
    const gpus = c.resources?.limits?.['nvidia.com/gpu'];
    if (gpus && !(c.volumeMounts ?? []).some((m) => m.mountPath === '/dev/shm')) fail(where, 'GPU pod without /dev/shm');
    if (gpus && c.resources?.requests?.['nvidia.com/gpu'] !== gpus) fail(where, 'GPU requests must equal limits');
    for (const m of c.volumeMounts ?? []) {
      if (!(spec.volumes ?? []).some((v) => v.name === m.name)) fail(where, `volumeMount ${m.name} has no volume`);
    }
  }
  if (spec.securityContext?.runAsNonRoot !== true) fail(where, 'pods must run as non-root');
}
for (const svc of all.filter((d) => d.kind === 'Service')) {
  const pods = templates.filter(({ t }) => matches(svc.spec.selector, t.metadata?.labels));
  if (templates.length > 0 && pods.length === 0) fail(`Service/${svc.metadata.name}`, 'selects no pod template');
  for (const port of svc.spec.ports ?? []) {
    if (typeof port.targetPort !== 'string' || pods.length === 0) continue;
    const named = pods.some(({ t }) => (t.spec.containers ?? []).some((c) => (c.ports ?? []).some((p) => p.name === port.targetPort)));
    if (!named) fail(`Service/${svc.metadata.name}`, `targetPort ${port.targetPort} is no container port`);
  }
}
for (const sm of all.filter((d) => d.kind === 'ServiceMonitor')) {
  const svcs = all.filter((d) => d.kind === 'Service' && matches(sm.spec.selector.matchLabels, d.metadata.labels));
  if (svcs.length === 0) fail(`ServiceMonitor/${sm.metadata.name}`, 'selects no Service');
  for (const ep of sm.spec.endpoints ?? []) {
    if (!svcs.some((s) => s.spec.ports.some((p) => p.name === ep.port))) fail(`ServiceMonitor/${sm.metadata.name}`, `no Service port ${ep.port}`);
  }
}
for (const pdb of all.filter((d) => d.kind === 'PodDisruptionBudget')) {
  if (templates.length > 0 && !templates.some(({ t }) => matches(pdb.spec.selector.matchLabels, t.metadata?.labels))) {
    fail(`PodDisruptionBudget/${pdb.metadata.name}`, 'selects no pod template');
  }
}
console.log(`${docs.length} documents checked, ${failures} problem(s)`);
process.exit(failures ? 1 : 0);
