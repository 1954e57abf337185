// An independent client (grpc-js + proto-loader, not our C++ stubs) against a running node:
// health, Generate streaming, Abort, and an INVALID_ARGUMENT that names the field.
//   node client_test.js HOST:PORT
'use strict';
const path = require('path');
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const protoDir = path.join(__dirname, '..', '..', 'proto');
const opts = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
               includeDirs: [protoDir] };
const api = grpc.loadPackageDefinition(loader.loadSync('dsv4/v1/dsv4.proto', opts)).dsv4.v1;
const health = grpc.loadPackageDefinition(
    loader.loadSync('grpc/health/v1/health.proto', opts)).grpc.health.v1;

const target = process.argv[2];
const client = new api.Dsv4(target, grpc.credentials.createInsecure());
const healthClient = new health.Health(target, grpc.credentials.createInsecure());
const deadline = () => new Date(Date.now() + 30000);
let failures = 0;
function check(cond, what) {
  console.log(`${cond ? 'ok  ' : 'FAIL'} ${what}`);
  if (!cond) failures++;
}

function generate(request, onChunk) {
  return new Promise((resolve) => {
    const call = client.Generate(request, { deadline: deadline() });
    const out = { tokens: [], text: '', finished: null, error: null, status: null, call };
    call.on('data', (r) => {
      if (r.chunk) {
        out.tokens.push(...r.chunk.token_ids);
        out.text += r.chunk.text;
        if (onChunk) onChunk(out, r);
      }
      if (r.finished) out.finished = r.finished;
    });
    call.on('error', (e) => { out.error = e; });
    call.on('status', (s) => { out.status = s; resolve(out); });
  });
}

(async () => {
  const h = await new Promise((resolve) => healthClient.Check({ service: '' },
      { deadline: deadline() }, (e, r) => resolve(e ? { status: String(e) } : r)));
  check(h.status === 'SERVING', `health Check -> ${h.status}`);

  const greedy = [37, 324, 305, 373, 625, 667, 259, 969];
  const g = await generate({ token_ids: { ids: [263, 1015, 148, 447, 146] }, max_tokens: 8 });
  check(JSON.stringify(g.tokens) === JSON.stringify(greedy), `Generate streams ${g.tokens}`);
  check(g.finished && g.finished.finish_reason === 'LENGTH', 'Generate finishes with LENGTH');
  check(g.finished && g.finished.usage.completion_tokens === 8, 'usage.completion_tokens = 8');

  let aborted = null;
  const a = await generate({ request_id: 'node-abort', token_ids: { ids: [5, 6, 7] },
                             max_tokens: 900, ignore_eos: true },
      (out) => {
        if (out.tokens.length === 3 && aborted === null) {
          aborted = 'pending';
          client.Abort({ request_id: 'node-abort' }, { deadline: deadline() },
                       (e, r) => { aborted = e ? String(e) : r.found; });
        }
      });
  check(aborted === true, `Abort found the request (${aborted})`);
  check(a.finished && a.finished.finish_reason === 'CANCELLED',
        `aborted stream ends CANCELLED after ${a.tokens.length} tokens`);

  const bad = await generate({ token_ids: { ids: [5] }, sampling: { top_p: 2 } });
  check(bad.error && bad.error.code === grpc.status.INVALID_ARGUMENT &&
        bad.error.details.startsWith('sampling.top_p'),
        `invalid top_p -> ${bad.error && bad.error.code} ${bad.error && bad.error.details}`);

  const info = await new Promise((resolve) => client.GetModelInfo({}, { deadline: deadline() },
      (e, r) => resolve(e ? null : r)));
  check(info && info.vocab_size === 1024, 'GetModelInfo vocab_size = 1024');

  client.close();
  healthClient.close();
  process.exit(failures ? 1 : 0);
})();
