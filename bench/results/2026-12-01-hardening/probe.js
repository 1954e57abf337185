// The gRPC-level findings of issue #18, probed with an independent client (grpc-js): run against
// an old and a new node to show each finding before and after. Prints one line per probe.
//   NODE_PATH=tests/node_client/node_modules node probe.js HOST:PORT
'use strict';
const path = require('path');
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const root = path.join(__dirname, '..', '..', '..');
const opts = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
               includeDirs: [path.join(root, 'proto')] };
const api = grpc.loadPackageDefinition(loader.loadSync('dsv4/v1/dsv4.proto', opts)).dsv4.v1;
const health = grpc.loadPackageDefinition(
    loader.loadSync('grpc/health/v1/health.proto', opts)).grpc.health.v1;
const target = process.argv[2];
// Each client its own connection.
const client = (tag) => new api.Dsv4(target, grpc.credentials.createInsecure(), { 'dsv4.probe': tag });
const deadline = (s = 30) => new Date(Date.now() + s * 1000);

function generate(c, request, onChunk, seconds = 30) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const call = c.Generate(request, { deadline: deadline(seconds) });
    const out = { tokens: [], finished: null, error: null, ids: new Set() };
    call.on('data', (r) => {
      out.ids.add(r.request_id);
      if (r.chunk) { out.tokens.push(...r.chunk.token_ids); if (onChunk) onChunk(out); }
      if (r.finished) out.finished = r.finished;
    });
    call.on('error', (e) => { out.error = e; });
    call.on('status', () => { out.ms = Date.now() - t0; resolve(out); });
  });
}
const code = (o) => (o.error ? grpc.status[o.error.code] : 'OK');
const say = (k, v) => console.log(`${k}: ${v}`);

async function role() {
  for (const kb of [16, 64]) {
    const c = client(`role${kb}`);
    const r = await generate(c, { chat: { messages: [{ role: 'r'.repeat(kb * 1024), content: 'hi' }] } }, null, 10);
    const next = await generate(c, { token_ids: { ids: [5, 6] }, max_tokens: 2 }, null, 10);
    say(`finding4.role_${kb}KiB`, `${code(r)} message_bytes=${r.error ? r.error.details.length : 0} ` +
        `${r.ms}ms; next call on the same connection: ${code(next)} ${next.ms}ms`);
    c.close();
  }
}

async function abort() {
  const owner = client('owner'), other = client('other');
  let aborted = null;
  const running = generate(owner, { request_id: 'victim', token_ids: { ids: [5, 6, 7] },
                                    max_tokens: 600, ignore_eos: true }, (o) => {
    if (o.tokens.length === 3 && aborted === null) {
      aborted = 'pending';
      other.Abort({ request_id: 'victim' }, { deadline: deadline() }, (e, r) => {
        aborted = e ? String(e) : r.found;
      });
    }
  }, 120);
  const v = await running;
  say('finding5.abort_by_other_connection', `found=${aborted} victim_finish=` +
      `${v.finished ? v.finished.finish_reason : code(v)} tokens=${v.tokens.length}`);
  const ids = [];
  for (let i = 0; i < 3; i++) ids.push([...(await generate(other, { token_ids: { ids: [5] }, max_tokens: 1 })).ids][0]);
  say('finding5.assigned_ids', ids.join(' '));
  owner.close(); other.close();
}

async function flood() {
  const hc = new health.Health(target, grpc.credentials.createInsecure(), { 'dsv4.probe': 'health' });
  const probe = client('probe');
  const big = [];
  const t0 = Date.now();
  for (let i = 0; i < 16; i++) {
    big.push(generate(client(`flood${i}`), { text: String.fromCharCode(97 + i).repeat(1 << 20) }, null, 60));
  }
  const checks = [];
  const smalls = [];
  const t1 = Date.now();
  while (Date.now() - t1 < 1500) {
    const s = Date.now();
    await new Promise((res) => hc.Check({ service: '' }, { deadline: deadline() }, () => res()));
    checks.push(Date.now() - s);
    smalls.push((await generate(probe, { token_ids: { ids: [5, 6] }, max_tokens: 1 })).ms);
  }
  const results = await Promise.all(big);
  const codes = {};
  for (const r of results) codes[code(r)] = (codes[code(r)] || 0) + 1;
  const max = (a) => Math.max(...a), med = (a) => a.slice().sort((x, y) => x - y)[a.length >> 1];
  say('finding7.flood_16x1MiB', `codes=${JSON.stringify(codes)} all_done=${Date.now() - t0}ms ` +
      `health_ms med=${med(checks)} max=${max(checks)} (n=${checks.length}) ` +
      `small_request_ms med=${med(smalls)} max=${max(smalls)}`);
}

function raw(method, bytes) {
  return new Promise((resolve) => {
    const c = client(`raw${method}`);
    const call = c.makeServerStreamRequest(method, (x) => x, (b) => b, bytes, {}, { deadline: deadline(10) });
    call.on('data', () => {});
    call.on('error', (e) => resolve(`${grpc.status[e.code]} "${e.details}"`));
    call.on('status', (s) => { if (s.code === 0) resolve('OK'); });
  });
}

async function malformed() {
  say('finding9.malformed_protobuf', await raw('/dsv4.v1.Dsv4/Generate', Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0x01])));
  say('finding9.invalid_utf8_text', await raw('/dsv4.v1.Dsv4/Generate', Buffer.from([0x1a, 0x02, 0xff, 0xfe])));
}

async function defaultMaxTokens() {
  const r = await generate(client('kv'), { token_ids: { ids: [5, 6, 7] }, ignore_eos: true });
  say('finding9.no_max_tokens', `${code(r)}${r.error ? ' ' + r.error.details : ''} tokens=${r.tokens.length}`);
}

(async () => {
  const which = process.argv[3] || 'all';
  if (which === 'all' || which === 'role') await role();
  if (which === 'all' || which === 'abort') await abort();
  if (which === 'all' || which === 'flood') await flood();
  if (which === 'all' || which === 'malformed') await malformed();
  if (which === 'kv') await defaultMaxTokens();
  process.exit(0);
})();
