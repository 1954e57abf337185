// Unwraps a PrometheusRule (deploy/k8s/prometheus-rules.yaml) into a plain rule-group file that
// promtool and a Prometheus server load.
//   node extract-rules.mjs IN OUT [--for DURATION] [--interval DURATION]
// --for replaces every alert's `for:` (the end-to-end test uses 0s to see alerts within seconds);
// --interval sets every group's evaluation interval.
import fs from 'node:fs';
import yaml from 'js-yaml';

const [input, output, ...rest] = process.argv.slice(2);
const opt = {};
for (let i = 0; i < rest.length; i += 2) opt[rest[i].replace(/^--/, '')] = rest[i + 1];
const doc = yaml.load(fs.readFileSync(input, 'utf8'));
if (doc.kind !== 'PrometheusRule' || !doc.spec || !Array.isArray(doc.spec.groups)) {
  console.error(`${input}: not a PrometheusRule with spec.groups`);
  process.exit(1);
}
const groups = doc.spec.groups.map((g) => {
  const out = { ...g };
  if (opt.interval) out.interval = opt.interval;
  out.rules = g.rules.map((r) => (r.alert && opt.for !== undefined ? { ...r, for: opt.for } : r));
  return out;
});
fs.writeFileSync(output, yaml.dump({ groups }, { lineWidth: -1 }));
