// Checks the Grafana dashboard and lists what it and the alert rules query.
//   node dashboard.mjs DASHBOARD.json RULES.yaml OUT_RULES.yaml OUT_METRICS.txt
// * dashboard structure: uid/title/schemaVersion, unique panel ids, every panel has a Prometheus
//   datasource and at least one target with an expression;
// * OUT_RULES.yaml: every panel expression (dashboard variables replaced by fixed values) as a
//   recording rule, so `promtool check rules` parses them all;
// * OUT_METRICS.txt: every metric family the dashboard and the rules read (histogram suffixes
//   stripped; recording-rule outputs and `up` left out), one per line, for the exposition check.
import fs from 'node:fs';
import yaml from 'js-yaml';

const [dashFile, rulesFile, outRules, outMetrics] = process.argv.slice(2);
const dash = JSON.parse(fs.readFileSync(dashFile, 'utf8'));
let problems = 0;
const bad = (m) => { problems++; console.log(`FAIL ${m}`); };
for (const k of ['uid', 'title', 'schemaVersion', 'panels', 'templating']) if (dash[k] === undefined) bad(`dashboard lacks ${k}`);
const ids = new Set();
const exprs = [];
for (const p of dash.panels) {
  if (ids.has(p.id)) bad(`duplicate panel id ${p.id}`);
  ids.add(p.id);
  if (p.type === 'row') continue;
  if (!p.title) bad(`panel ${p.id} has no title`);
  if (p.datasource?.type !== 'prometheus') bad(`panel "${p.title}" has no Prometheus datasource`);
  if (!Array.isArray(p.targets) || p.targets.length === 0) bad(`panel "${p.title}" has no targets`);
  for (const t of p.targets ?? []) {
    if (!t.expr) bad(`panel "${p.title}" target ${t.refId} has no expr`);
    else exprs.push({ panel: p.title, expr: t.expr });
  }
}
const vars = { '$__rate_interval': '5m', '$__interval': '1m', '$job': 'dsv4-node', '$instance': '.*' };
const concrete = (e) => Object.entries(vars).reduce((s, [k, v]) => s.split(k).join(v), e);
const rules = exprs.map((e, i) => ({ record: `dashboard:panel_${i}`, expr: concrete(e.expr) }));
fs.writeFileSync(outRules, yaml.dump({ groups: [{ name: 'dashboard', rules }] }, { lineWidth: -1 }));

const doc = yaml.load(fs.readFileSync(rulesFile, 'utf8'));
const ruleExprs = doc.spec.groups.flatMap((g) => g.rules.map((r) => r.expr));
const recorded = new Set(doc.spec.groups.flatMap((g) => g.rules.filter((r) => r.record).map((r) => r.record)));
for (const e of exprs) {
  for (const m of e.expr.matchAll(/\b(dsv4:[a-z0-9_:]+)/g)) {
    if (!recorded.has(m[1])) bad(`panel "${e.panel}" reads ${m[1]}, which no recording rule defines`);
  }
}
const metrics = new Set();
for (const e of [...exprs.map((x) => x.expr), ...ruleExprs]) {
  for (const m of e.matchAll(/\b(dsv4_[a-z0-9_]+)/g)) metrics.add(m[1].replace(/_(bucket|count|sum)$/, ''));
}
fs.writeFileSync(outMetrics, [...metrics].sort().join('\n') + '\n');
console.log(`${dash.panels.length} panels, ${exprs.length} expressions, ${metrics.size} metric families; ${problems} problem(s)`);
process.exit(problems ? 1 : 0);
