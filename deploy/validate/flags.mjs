// Prints every dsv4-node flag the manifests pass, one "COMMAND FLAG" line each (COMMAND is the
// subcommand, or "-" for the global flags before it), for check_manifests.sh to check against
// the binary's --help. Usage: node flags.mjs FILE...
import fs from 'node:fs';
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
const seen = new Set();
for (const file of process.argv.slice(2)) {
  for (const doc of yaml.loadAll(fs.readFileSync(file, 'utf8'))) {
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
