// Offline validation of Kubernetes manifests (no API server):
//   * every document against its schema: kubernetes-models (core/apps/policy),
//     @kubernetes-models/prometheus-operator (ServiceMonitor, PrometheusRule), and the
//     LeaderWorkerSet CRD schema (leaderworkerset.schema.json) with both pod templates checked as
//     core/v1 PodTemplateSpec;
//   * cross-resource rules the schemas cannot see: Service target ports and ServiceMonitor ports
//     exist, selectors match pod labels, gRPC probes are present, the termination grace period
//     exceeds the node's drain timeout, images are pinned, GPU pods get /dev/shm;
//   * the serve container against its flags (the args, and the ConfigMap file its --config names
//     through its volume mounts): each listener (listen, http-listen, metrics-listen,
//     worker-listen) has the containerPort of its name (grpc, http, metrics, control) with the
//     same number, a declared grpc/http/metrics port has its listener on a non-loopback address,
//     gRPC probes ask the listen port, file flags (config, api-key-file, tls-*, ...) lie under a
//     volume mount, api-key-file comes with http-listen.
//   node validate.mjs FILE.yaml...        (rendered overlays or raw resource files)
//   node validate.mjs --labels-from KUSTOMIZATION.yaml FILE.yaml...
// --labels-from: raw resource files get the Kustomization's `labels` pairs on their metadata, as
// `kubectl kustomize` would give them (includeSelectors/includeTemplates are not applied).
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
let files = process.argv.slice(2);
let commonLabels = {};
if (files[0] === '--labels-from') {
  const k = yaml.load(fs.readFileSync(files[1], 'utf8'));
  for (const l of k.labels ?? []) Object.assign(commonLabels, l.pairs ?? {});
  files = files.slice(2);
}
for (const file of files) {
  yaml.loadAll(fs.readFileSync(file, 'utf8')).forEach((doc, i) => {
    if (!doc) return;
    if (Object.keys(commonLabels).length && doc.metadata) doc.metadata.labels = { ...commonLabels, ...doc.metadata.labels };
    docs.push({ doc, where: `${file}#${i} ${doc.kind}/${doc.metadata?.name}` });
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
// The flags a container passes: "--flag=value", "--flag value" or a bare "--flag" (true); the
// subcommand names are no values.
const commands = new Set(['serve', 'worker', 'client', 'loadgen', 'check-golden', 'generate', 'bench']);
const argFlags = (args) => {
  const flags = new Map();
  for (let i = 0; i < args.length; i++) {
    const a = String(args[i]);
    if (!a.startsWith('--')) continue;
    const eq = a.indexOf('=');
    if (eq > 0) { flags.set(a.slice(2, eq), a.slice(eq + 1)); continue; }
    const next = args[i + 1];
    if (next !== undefined && !String(next).startsWith('-') && !commands.has(String(next))) { flags.set(a.slice(2), String(next)); i++; }
    else flags.set(a.slice(2), true);
  }
  return flags;
};
// The [serve] section of a TOML-ish flag file: key = "string" | number | bool.
const tomlSection = (text, section) => {
  const flags = new Map();
  let current = null;
  for (const line of text.split('\n')) {
    const h = /^\s*\[([A-Za-z0-9_-]+)\]\s*$/.exec(line);
    if (h) { current = h[1]; continue; }
    const kv = /^\s*([A-Za-z0-9_-]+)\s*=\s*(.*?)\s*$/.exec(line);
    if (kv && current === section) flags.set(kv[1], kv[2].replace(/^"(.*)"$/, '$1'));
  }
  return flags;
};
const underMount = (c, file) => (c.volumeMounts ?? []).some((m) => file === m.mountPath || file.startsWith(m.mountPath.replace(/\/$/, '') + '/'));
// The serve flags of a container: the ConfigMap file named by --config (resolved through the
// container's volume mounts), then the args on top (CLI11: the command line wins).
function serveFlags(c, spec, where) {
  const args = argFlags(c.args ?? []);
  const flags = new Map();
  const config = args.get('config');
  if (typeof config === 'string') {
    const mount = (c.volumeMounts ?? []).find((m) => config.startsWith(m.mountPath.replace(/\/$/, '') + '/'));
    const volume = mount && (spec.volumes ?? []).find((v) => v.name === mount.name);
    if (!mount) fail(where, `${c.name}: --config ${config} is under no volume mount`);
    else if (volume?.configMap) {
      const key = config.slice(mount.mountPath.replace(/\/$/, '').length + 1);
      const cm = all.find((d) => d.kind === 'ConfigMap' && d.metadata?.name === volume.configMap.name);
      if (!cm) fail(where, `${c.name}: --config reads ConfigMap ${volume.configMap.name}, which is not in the manifests`);
      else if (cm.data?.[key] === undefined) fail(where, `${c.name}: ConfigMap ${volume.configMap.name} has no key ${key} (--config ${config})`);
      else for (const [k, v] of tomlSection(cm.data[key], 'serve')) flags.set(k, v);
    }
  }
  for (const [k, v] of args) if (k !== 'config') flags.set(k, v);
  return flags;
}
const listeners = { listen: 'grpc', 'http-listen': 'http', 'metrics-listen': 'metrics', 'worker-listen': 'control' };
const hostPort = (addr) => {
  const m = /^(.*):([0-9]+)$/.exec(String(addr));
  return m ? { host: m[1].replace(/^\[(.*)\]$/, '$1'), port: Number(m[2]) } : null;
};
const loopback = (host) => host === 'localhost' || host === '::1' || /^127\./.test(host);
const fileFlags = /^(config|model|tokenizer|tls-cert|tls-key|tls-client-ca|.*-file)$/;
function checkServeContainer(c, spec, where) {
  const flags = serveFlags(c, spec, where);
  const ports = new Map((c.ports ?? []).filter((p) => p.name).map((p) => [p.name, p.containerPort]));
  for (const [flag, portName] of Object.entries(listeners)) {
    const value = flags.get(flag);
    const declared = ports.get(portName);
    if (value === undefined) {
      if (declared !== undefined && portName !== 'control') fail(where, `${c.name}: containerPort ${portName} (${declared}) but no ${flag}: nothing listens there`);
      continue;
    }
    const hp = hostPort(value);
    if (!hp) { fail(where, `${c.name}: ${flag} "${value}" is not HOST:PORT`); continue; }
    if (hp.port === 0) continue;
    if (declared === undefined) fail(where, `${c.name}: ${flag} ${value} has no containerPort named ${portName}`);
    else if (declared !== hp.port) fail(where, `${c.name}: ${flag} listens on ${hp.port} but containerPort ${portName} is ${declared}`);
    else if (loopback(hp.host) && portName !== 'control') fail(where, `${c.name}: ${flag} ${value} is loopback: containerPort ${portName} is unreachable`);
  }
  const grpcPort = hostPort(flags.get('listen') ?? '')?.port;
  for (const p of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
    const port = c[p]?.grpc?.port;
    if (port !== undefined && grpcPort !== undefined && port !== grpcPort) fail(where, `${c.name}: ${p} asks port ${port}, listen is ${grpcPort}`);
  }
  for (const [flag, value] of flags) {
    if (fileFlags.test(flag) && flag !== 'port-file' && typeof value === 'string' && value.startsWith('/') && !underMount(c, value)) {
      fail(where, `${c.name}: ${flag} ${value} is under no volume mount (read-only root filesystem)`);
    }
  }
  if (flags.has('api-key-file') && !flags.has('http-listen')) fail(where, `${c.name}: api-key-file without http-listen (serve refuses it)`);
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
      checkServeContainer(c, spec, where);
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
  const names = (svc.spec.ports ?? []).map((p) => p.name);
  for (const n of new Set(names)) if (names.filter((x) => x === n).length > 1) fail(`Service/${svc.metadata.name}`, `port name ${n} twice`);
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
