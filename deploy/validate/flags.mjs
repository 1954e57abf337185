// Prints every dsv4-node flag the manifests pass, one "COMMAND FLAG" line each (COMMAND is the
// subcommand, or "-" for the global flags before it), for check_manifests.sh to check against
// the binary's --help: the pod templates' args, and the keys of every flag file (a string value
// anywhere, e.g. a ConfigMap's dsv4-node.toml or an overlay's inline patch of it, with a
// [COMMAND] section header) as "COMMAND --KEY".
// With --configs DIR, also writes each distinct flag file found to DIR/config-N.toml, for
// check_manifests.sh to parse with the binary itself (`dsv4-node --config FILE serve --help`:
// unknown keys and out-of-range values are errors there).
//   node flags.mjs [--configs DIR] FILE...
import fs from 'node:fs';
import path from 'node:path';
import yaml from 'js-yaml';

const commands = new Set(['serve', 'worker', 'client', 'loadgen', 'check-golden', 'generate', 'bench']);
const templates = (doc) => {
  if (doc?.kind === 'StatefulSet' || doc?.kind === 'Deployment') return [doc.spec.template];
  if (doc?.kind === 'LeaderWorkerSet') {
    const t = doc.spec.leaderWorkerTemplate;
    return [t.leaderTemplate, t.workerTemplate].filter(Boolean);
  }
  return [];
};
let args = process.argv.slice(2);
let configsDir = null;
if (args[0] === '--configs') { configsDir = args[1]; args = args.slice(2); }
const seen = new Set();
const configs = new Set();
// A flag file inside a string: a [COMMAND] header line, then `key = value` lines. Inline patches
// carry it indented (a YAML block), so leading whitespace is dropped.
const scanFlagFile = (text) => {
  const lines = text.split('\n');
  const header = lines.findIndex((l) => /^\s*\[([a-z-]+)\]\s*$/.test(l) && commands.has(/\[([a-z-]+)\]/.exec(l)[1]));
  if (header < 0) return;
  const indent = /^\s*/.exec(lines[header])[0].length;
  const file = [];
  let command = null;
  for (const l of lines.slice(header)) {
    if (l.trim() !== '' && /^\s*/.exec(l)[0].length < indent) break;  // the block ended
    const h = /^\s*\[([a-z-]+)\]\s*$/.exec(l);
    const kv = /^\s*([A-Za-z0-9_-]+)\s*=/.exec(l);
    if (h) command = h[1];
    else if (kv && command) seen.add(`${command} --${kv[1]}`);
    file.push(l.slice(Math.min(indent, /^\s*/.exec(l)[0].length)));
  }
  configs.add(file.join('\n').trimEnd() + '\n');
};
const walk = (v) => {
  if (typeof v === 'string') { if (v.includes('[')) scanFlagFile(v); return; }
  if (Array.isArray(v)) { v.forEach(walk); return; }
  if (v && typeof v === 'object') Object.values(v).forEach(walk);
};
for (const file of args) {
  for (const doc of yaml.loadAll(fs.readFileSync(file, 'utf8'))) {
    walk(doc);
    for (const t of templates(doc)) {
      for (const c of t.spec?.containers ?? []) {
        let command = '-';
        for (const a of c.args ?? []) {
          if (commands.has(a)) command = a;
          else if (a.startsWith('--')) seen.add(`${command} ${a.split('=')[0]}`);
        }
      }
    }
  }
}
for (const line of [...seen].sort()) console.log(line);
if (configsDir) {
  fs.mkdirSync(configsDir, { recursive: true });
  [...configs].forEach((text, i) => fs.writeFileSync(path.join(configsDir, `config-${i}.toml`), text));
}
