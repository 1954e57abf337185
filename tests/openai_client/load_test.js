// Load and leak check of the node's OpenAI-compatible HTTP API. Three rounds, each:
//   1. 256 concurrent streamed chat requests (max_tokens 16): all must finish with a finish_reason;
//   2. 1000 keep-alive connections, each sending one `GET /health` and then left open and idle,
//      while a normal chat request must still succeed; then all of them are closed;
//   3. the node's RSS (VmRSS of /proc/PID/status).
// Passes if the third round's RSS exceeds the first's by less than 10 %. A watchdog ends a hung run
// after 400 s (a bound on a hang, not a speed check: CI shares two cores).
//   node load_test.js BASE_URL METRICS_HOSTPORT PID     (env DSV4_API_KEY: the node's key, if any)
'use strict';
const fs = require('fs');
const net = require('net');
const OpenAI = require('openai');

const [BASE_URL, METRICS, PID] = process.argv.slice(2);
if (!BASE_URL || !METRICS || !PID) {
  console.error('usage: node load_test.js BASE_URL METRICS_HOSTPORT PID');
  process.exit(2);
}
const STREAMS = 256;
const IDLE = 1000;
const ROUNDS = 3;
const base = new URL(BASE_URL);
const client = new OpenAI({ baseURL: BASE_URL + '/v1', apiKey: process.env.DSV4_API_KEY || 'none',
                            maxRetries: 0, timeout: 60000 });

let failures = 0;
function check(cond, what, detail) {
  console.log(`${cond ? 'ok  ' : 'FAIL'} ${what}${!cond && detail !== undefined ? `  -- ${detail}` : ''}`);
  if (!cond) failures++;
  return cond;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const started = Date.now();
const guard = setTimeout(() => {
  check(false, 'the load test did not hang (400 s watchdog)');
  process.exit(1);
}, 400000);

function rssKiB() {
  const status = fs.readFileSync(`/proc/${PID}/status`, 'utf8');
  const m = status.match(/^VmRSS:\s+(\d+)\s+kB/m);
  return m ? Number(m[1]) : NaN;
}

async function metric(name) {
  const text = await (await fetch(`http://${METRICS}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' ') || l.startsWith(name + '{'));
  return line ? Number(line.trim().split(/\s+/).pop()) : null;
}

// One streamed chat request; resolves {finish, tokens} or {error}.
async function oneStream(model, i) {
  try {
    const stream = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: `Load test request ${i}.` }], max_tokens: 16,
      temperature: 0, stream: true, stream_options: { include_usage: true },
    });
    const finishes = [];
    let usage = null;
    for await (const chunk of stream) {
      for (const c of chunk.choices) if (c.finish_reason) finishes.push(c.finish_reason);
      if (chunk.usage) usage = chunk.usage;
    }
    if (finishes.length !== 1) return { error: `finish reasons ${JSON.stringify(finishes)}` };
    return { finish: finishes[0], tokens: usage && usage.completion_tokens };
  } catch (e) {
    return { error: `${e.constructor.name} ${e.status || ''} ${e.message}` };
  }
}

// Opens IDLE connections (in batches), each sending one keep-alive GET /health. Resolves when
// every connection got its answer or was closed by the server (the node may close the oldest
// idle connections to make room), or after 30 s.
function openIdle() {
  const conns = [];
  const request = `GET /health HTTP/1.1\r\nHost: ${base.host}\r\nConnection: keep-alive\r\n\r\n`;
  return new Promise((resolve) => {
    let settled = 0;
    const deadline = setTimeout(() => resolve(conns), 30000);
    const settle = (c) => {
      if (c.settled) return;
      c.settled = true;
      if (++settled === IDLE) {
        clearTimeout(deadline);
        resolve(conns);
      }
    };
    let next = 0;
    const openBatch = () => {
      for (let k = 0; k < 100 && next < IDLE; k++, next++) {
        const c = { socket: null, status: null, closedByServer: false, error: null, settled: false, data: '' };
        c.socket = net.connect({ host: base.hostname, port: Number(base.port) }, () => c.socket.write(request));
        c.socket.setEncoding('latin1');
        c.socket.on('data', (d) => {
          c.data += d;
          const m = c.data.match(/^HTTP\/1\.1 (\d{3})/);
          if (m && c.data.includes('\r\n\r\n')) {
            c.status = Number(m[1]);
            settle(c);
          }
        });
        c.socket.on('end', () => { c.closedByServer = true; settle(c); });
        c.socket.on('close', () => { if (!c.mine) c.closedByServer = true; settle(c); });
        c.socket.on('error', (e) => { c.error = e.code || e.message; settle(c); });
        conns.push(c);
      }
      if (next < IDLE) setTimeout(openBatch, 20);
    };
    openBatch();
  });
}

(async () => {
  const models = await client.models.list();
  const model = models.data[0].id;
  const rss = [];
  for (let round = 1; round <= ROUNDS; round++) {
    // 1. Concurrent streams.
    const t0 = Date.now();
    const results = await Promise.all(Array.from({ length: STREAMS }, (_, i) => oneStream(model, i)));
    const bad = results.filter((r) => r.error || !['stop', 'length'].includes(r.finish));
    check(bad.length === 0, `round ${round}: ${STREAMS} concurrent streams all finish (${Date.now() - t0} ms)`,
          `${bad.length} did not: ${JSON.stringify(bad.slice(0, 3))}`);

    // 2. Idle keep-alive connections, and a normal request while they are open.
    const t1 = Date.now();
    const conns = await openIdle();
    const answered = conns.filter((c) => c.status === 200).length;
    const evicted = conns.filter((c) => c.closedByServer).length;
    const otherStatus = conns.filter((c) => c.status !== null && c.status !== 200);
    const hanging = conns.filter((c) => !c.settled).length;
    const errors = conns.filter((c) => c.error).length;
    console.log(`round ${round}: ${IDLE} idle connections in ${Date.now() - t1} ms: ${answered} answered 200, ` +
                `${evicted} closed by the node, ${errors} errors, ${hanging} without answer`);
    check(hanging === 0 && otherStatus.length === 0 && answered > 0,
          `round ${round}: every idle connection got 200 for GET /health or was closed by the node`,
          `${hanging} hanging, other statuses ${JSON.stringify(otherStatus.slice(0, 3).map((c) => c.status))}`);
    const normal = await oneStream(model, -1);
    check(!normal.error && normal.finish, `round ${round}: a normal request succeeds while they are open`,
          normal.error);
    for (const c of conns) {
      c.mine = true;
      c.socket.destroy();
    }

    // 3. Memory once everything is closed.
    await sleep(1000);
    const running = await metric('dsv4_num_requests_running');
    check(running === 0, `round ${round}: no request left running`, `dsv4_num_requests_running ${running}`);
    rss.push(rssKiB());
    console.log(`round ${round}: node RSS ${rss[round - 1]} kB`);
  }
  const growth = (rss[2] - rss[0]) / rss[0];
  check(Number.isFinite(growth) && growth < 0.10,
        `RSS after rounds 1/2/3: ${rss.join(' / ')} kB; round 3 exceeds round 1 by ${(growth * 100).toFixed(1)} % (< 10 %)`);
  clearTimeout(guard);
  console.log(`${failures ? `${failures} check(s) failed` : 'all checks passed'} in ${Date.now() - started} ms`);
  process.exit(failures ? 1 : 0);
})().catch((e) => {
  check(false, 'load test ran', String(e && e.stack || e));
  process.exit(1);
});
