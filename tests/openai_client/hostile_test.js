// Malformed and hostile requests against the node's OpenAI-compatible HTTP API (plain `http`, no
// SDK). Each must get the expected status and an OpenAI error object
// {"error": {"message", "type", "param", "code"}} whose message or param names the field; after
// all of them the node must still be healthy and serve a normal request.
//   node hostile_test.js BASE_URL        (env DSV4_API_KEY: the node's key, if it has one)
'use strict';
const http = require('http');
const net = require('net');

const BASE_URL = process.argv[2];
if (!BASE_URL) {
  console.error('usage: node hostile_test.js BASE_URL');
  process.exit(2);
}
const base = new URL(BASE_URL);
const API_KEY = process.env.DSV4_API_KEY || '';

let failures = 0;
function check(cond, what, detail) {
  console.log(`${cond ? 'ok  ' : 'FAIL'} ${what}${!cond && detail !== undefined ? `  -- ${detail}` : ''}`);
  if (!cond) failures++;
  return cond;
}
function show(v) {
  const s = typeof v === 'string' ? v : JSON.stringify(v);
  return s !== undefined && s.length > 300 ? s.slice(0, 300) + '…' : s;
}

// One request on a fresh connection. `body`: a Buffer or string sent as is, or any other value
// sent as its JSON. Resolves {status, headers, text, json} or {error} (connection failure); a
// response that arrives while the body is still being written (413) counts as the answer.
let sent = 0;
function request(method, path, body, headers = {}) {
  sent++;
  return new Promise((resolve) => {
    let data = null;
    if (body !== undefined) {
      data = Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
    }
    const h = { 'Content-Type': 'application/json', Connection: 'close', ...headers };
    if (API_KEY) h.Authorization = `Bearer ${API_KEY}`;
    if (data) h['Content-Length'] = data.length;
    const req = http.request({ host: base.hostname, port: base.port, method, path, headers: h,
                               agent: false, timeout: 30000 });
    let done = false;
    const finish = (v) => { if (!done) { done = true; resolve(v); } };
    req.on('response', (res) => {
      const parts = [];
      res.on('data', (c) => parts.push(c));
      res.on('error', () => {});
      res.on('end', () => {
        const text = Buffer.concat(parts).toString('utf8');
        let json = null;
        try { json = JSON.parse(text); } catch (e) { /* not JSON */ }
        finish({ status: res.statusCode, headers: res.headers, text, json });
      });
    });
    req.on('timeout', () => { req.destroy(new Error('timed out after 30 s')); });
    // EPIPE/ECONNRESET while writing a body the server refused: wait a moment for its answer.
    req.on('error', (e) => setTimeout(() => finish({ error: e }), 500));
    if (data) req.end(data);
    else req.end();
  });
}

// Whether the error's param contains `name`, or its message has `name` as a whole word.
function namesField(e, name) {
  const n = name.toLowerCase();
  if (typeof e.param === 'string' && e.param.toLowerCase().includes(n)) return true;
  const escaped = n.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  return new RegExp(`(^|[^a-z0-9_])${escaped}([^a-z0-9_]|$)`, 'i').test(e.message);
}

// A request with a large body on a raw socket: sends the head, gives the node a second to refuse
// it by Content-Length alone (a refusal that arrives mid-body is often lost to EPIPE/ECONNRESET),
// then sends the body. Resolves like request().
function requestLargeBody(path, body) {
  sent++;
  return new Promise((resolve) => {
    const head = `POST ${path} HTTP/1.1\r\nHost: ${base.host}\r\nContent-Type: application/json\r\n` +
                 `Content-Length: ${body.length}\r\nConnection: close\r\n` +
                 (API_KEY ? `Authorization: Bearer ${API_KEY}\r\n` : '') + '\r\n';
    let data = Buffer.alloc(0);
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      socket.destroy();
      const text = data.toString('utf8');
      const m = text.match(/^HTTP\/1\.[01] (\d{3})/);
      if (!m) return resolve({ error: new Error(`no HTTP response (${JSON.stringify(text.slice(0, 80))})`) });
      const at = text.indexOf('\r\n\r\n');
      const headers = {};
      for (const line of text.slice(0, at).split('\r\n').slice(1)) {
        const i = line.indexOf(':');
        headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
      }
      let rest = text.slice(at + 4);
      if (/chunked/i.test(headers['transfer-encoding'] || '')) {
        let out = '';
        for (let i = 0; ;) {
          const eol = rest.indexOf('\r\n', i);
          const size = parseInt(rest.slice(i, eol), 16);
          if (eol < 0 || !(size > 0)) break;
          out += rest.slice(eol + 2, eol + 2 + size);
          i = eol + 2 + size + 2;
        }
        rest = out;
      }
      let json = null;
      try { json = JSON.parse(rest); } catch (e) { /* not JSON */ }
      resolve({ status: Number(m[1]), headers, text: rest, json });
    };
    const socket = net.connect({ host: base.hostname, port: Number(base.port) }, () => {
      socket.write(head);
      setTimeout(() => {
        if (data.length > 0 || done) return;
        let off = 0;
        const pump = () => {
          while (off < body.length && !done) {
            const ok = socket.write(body.subarray(off, off + 65536));
            off += 65536;
            if (!ok) return socket.once('drain', pump);
          }
        };
        pump();
      }, 1000);
    });
    socket.setTimeout(30000, finish);
    socket.on('data', (d) => {
      data = Buffer.concat([data, d]);
      const text = data.toString('utf8');
      const at = text.indexOf('\r\n\r\n');
      const len = /\r\ncontent-length: *(\d+)/i.exec(text.slice(0, at));
      if (at >= 0 && len && data.length >= Buffer.byteLength(text.slice(0, at + 4)) + Number(len[1])) finish();
      if (at >= 0 && !len && text.endsWith('\r\n0\r\n\r\n')) finish();
    });
    socket.on('error', () => setTimeout(finish, 200));
    socket.on('close', finish);
  });
}

// Checks one error answer: `status`, the error object, and that message or param contains one of
// `names` (case-insensitive; null: not checked).
function checkError(what, r, status, names) {
  if (r.error) return check(false, what, `connection failed: ${r.error.message}`);
  const e = r.json && r.json.error;
  const ok = r.status === status && e && typeof e === 'object' && typeof e.message === 'string' &&
             e.message.length > 0 && typeof e.type === 'string' && 'param' in e && 'code' in e;
  if (!check(ok, `${what} -> ${status} with an error object`, `got ${r.status} ${show(r.text)}`)) return false;
  if (status === 400) {
    check(e.type === 'invalid_request_error', `${what}: type invalid_request_error`, show(e));
  }
  if (names) {
    check(names.some((n) => namesField(e, n)), `${what}: error names ${names.join(' or ')}`, show(e));
  }
  return true;
}

(async () => {
  const models = await request('GET', '/v1/models');
  const model = models.json && models.json.data && models.json.data[0] && models.json.data[0].id;
  if (!check(typeof model === 'string', 'GET /v1/models names the model', show(models.text || models.error))) {
    process.exit(1);
  }
  const maxModelLen = models.json.data[0].max_model_len || 1024;
  const msgs = [{ role: 'user', content: 'hi' }];
  const chat = (fields) => ({ model, messages: msgs, max_tokens: 4, ...fields });
  const tool = (fn) => ({ type: 'function', function: fn });
  const weather = tool({ name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } });

  // [what, path, body, expected status, names (field the error must name)]
  const C = '/v1/chat/completions';
  const P = '/v1/completions';
  const cases = [
    ['invalid JSON', C, '{"model": "x", "messages": [', 400, ['json']],
    ['JSON array body', C, '[1, 2, 3]', 400, ['object']],
    ['JSON string body', C, '"hello"', 400, ['object']],
    ['JSON null body', C, 'null', 400, ['object']],
    ['empty body', C, '', 400, ['json', 'body', 'object']],
    ['model missing', C, { messages: msgs }, 400, ['model']],
    ['model a number', C, chat({ model: 42 }), 400, ['model']],
    ['messages missing', C, { model }, 400, ['messages']],
    ['messages a string', C, chat({ messages: 'hi' }), 400, ['messages']],
    ['messages empty', C, chat({ messages: [] }), 400, ['messages']],
    ['message not an object', C, chat({ messages: [1] }), 400, ['messages[0]']],
    ['unknown role', C, chat({ messages: [{ role: 'wizard', content: 'hi' }] }), 400, ['messages[0].role']],
    ['role missing', C, chat({ messages: [{ content: 'hi' }] }), 400, ['messages[0].role']],
    ['role a number', C, chat({ messages: [{ role: 7, content: 'hi' }] }), 400, ['messages[0].role']],
    ['user message without content', C, chat({ messages: [{ role: 'user' }] }), 400, ['messages[0].content']],
    ['content a number', C, chat({ messages: [{ role: 'user', content: 42 }] }), 400, ['messages[0].content']],
    ['content part without text', C, chat({ messages: [{ role: 'user', content: [{ type: 'text', text: 5 }] }] }),
     400, ['messages[0].content']],
    ['tool message without tool_call_id', C,
     chat({ messages: [{ role: 'user', content: 'hi' }, { role: 'tool', content: '{}' }] }), 400, ['tool_call_id']],
    ['max_tokens a string', C, chat({ max_tokens: '8' }), 400, ['max_tokens']],
    ['max_tokens fractional', C, chat({ max_tokens: 1.5 }), 400, ['max_tokens']],
    ['max_tokens negative', C, chat({ max_tokens: -1 }), 400, ['max_tokens']],
    ['max_tokens 0', C, chat({ max_tokens: 0 }), 400, ['max_tokens']],
    ['max_tokens 1e400', C, `{"model": ${JSON.stringify(model)}, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e400}`,
     400, ['max_tokens', 'json', 'number']],
    ['max_tokens over the model length', C, chat({ max_tokens: maxModelLen + 1 }), 400, ['max_tokens']],
    ['max_completion_tokens a string', C, chat({ max_tokens: undefined, max_completion_tokens: 'x' }), 400,
     ['max_completion_tokens']],
    ['temperature a string', C, chat({ temperature: 'hot' }), 400, ['temperature']],
    ['temperature -1', C, chat({ temperature: -1 }), 400, ['temperature']],
    ['top_p a string', C, chat({ top_p: '0.5' }), 400, ['top_p']],
    ['top_p 2', C, chat({ top_p: 2 }), 400, ['top_p']],
    ['top_k -2 (-1 and 0 mean off)', C, chat({ top_k: -2 }), 400, ['top_k']],
    ['top_k a string', C, chat({ top_k: '5' }), 400, ['top_k']],
    ['presence_penalty 5', C, chat({ presence_penalty: 5 }), 400, ['presence_penalty']],
    ['n a string', C, chat({ n: '1' }), 400, ['n']],
    ['n 1000000', C, chat({ n: 1000000 }), 400, ['n']],
    ['stop a number', C, chat({ stop: 5 }), 400, ['stop']],
    ['stop an array of numbers', C, chat({ stop: [1, 2] }), 400, ['stop']],
    ['stop with 17 strings', C, chat({ stop: Array.from({ length: 17 }, (_, i) => `s${i}`) }), 400, ['stop']],
    ['seed a string', C, chat({ seed: 'abc' }), 400, ['seed']],
    ['logprobs a string', C, chat({ logprobs: 'yes' }), 400, ['logprobs']],
    ['top_logprobs 100', C, chat({ logprobs: true, top_logprobs: 100 }), 400, ['top_logprobs']],
    ['stream a string', C, chat({ stream: 'yes' }), 400, ['stream']],
    ['stream_options.include_usage a string', C, chat({ stream: true, stream_options: { include_usage: 'yes' } }),
     400, ['include_usage', 'stream_options']],
    ['thinking.type unknown', C, chat({ thinking: { type: 'maybe' } }), 400, ['thinking']],
    ['reasoning_effort a number', C, chat({ reasoning_effort: 42 }), 400, ['reasoning_effort']],
    ['min_tokens over max_tokens', C, chat({ min_tokens: 10, max_tokens: 4 }), 400, ['min_tokens']],
    ['tools a string', C, chat({ tools: 'get_weather' }), 400, ['tools']],
    ['tool function missing name', C, chat({ tools: [tool({ parameters: { type: 'object' } })] }), 400,
     ['tools[0]']],
    ['tool parameters not an object', C, chat({ tools: [tool({ name: 'f', parameters: 'object' })] }), 400,
     ['tools[0]']],
    ['tool type not function', C, chat({ tools: [{ type: 'retrieval', function: { name: 'f' } }] }), 400,
     ['tools[0]']],
    ['tool_choice a number', C, chat({ tools: [weather], tool_choice: 42 }), 400, ['tool_choice']],
    ['tool_choice an unknown string', C, chat({ tools: [weather], tool_choice: 'sometimes' }), 400, ['tool_choice']],
    ['tool_choice naming an unknown function', C,
     chat({ tools: [weather], tool_choice: { type: 'function', function: { name: 'nope' } } }), 400, ['tool_choice']],
    ['tool_choice required without tools', C, chat({ tool_choice: 'required' }), 400, ['tool_choice']],
    ['unknown model', C, chat({ model: 'no-such-model' }), 404, ['model']],
    ['completions: prompt missing', P, { model, max_tokens: 4 }, 400, ['prompt']],
    ['completions: prompt a number', P, { model, prompt: 42, max_tokens: 4 }, 400, ['prompt']],
    ['completions: prompt an empty array', P, { model, prompt: [], max_tokens: 4 }, 400, ['prompt']],
    ['completions: token id out of the vocabulary', P, { model, prompt: [5, 999999], max_tokens: 4 }, 400, ['prompt']],
    ['completions: negative token id', P, { model, prompt: [5, -1], max_tokens: 4 }, 400, ['prompt']],
    ['completions: logprobs 100', P, { model, prompt: 'hi', max_tokens: 4, logprobs: 100 }, 400, ['logprobs']],
    ['completions: n 1000000', P, { model, prompt: 'hi', max_tokens: 4, n: 1000000 }, 400, ['n']],
    ['completions: unknown model', P, { model: 'no-such-model', prompt: 'hi' }, 404, ['model']],
  ];
  for (const [what, path, body, status, names] of cases) {
    checkError(what, await request('POST', path, body), status, names);
  }

  // Errors with a special status or shape.
  let r = await request('POST', C, chat({ model: 'no-such-model' }));
  check(r.json && r.json.error && r.json.error.code === 'model_not_found', 'unknown model: code model_not_found',
        show(r.text));

  const bigContent = 'a'.repeat(50 << 20);
  r = await requestLargeBody(C, Buffer.from(JSON.stringify(chat({ messages: [{ role: 'user', content: bigContent }] }))));
  checkError('a 50 MB body', r, 413, null);

  const badUtf8 = Buffer.concat([Buffer.from(`{"model": ${JSON.stringify(model)}, "messages": [{"role": "user", "content": "a`),
                                 Buffer.from([0xff, 0xfe, 0xc3, 0x28]), Buffer.from('"}], "max_tokens": 4}')]);
  checkError('invalid UTF-8 in the body', await request('POST', C, badUtf8), 400, ['utf', 'messages[0].content']);

  const depth = 100000;
  const nestedArrays = `{"model": ${JSON.stringify(model)}, "messages": ${'['.repeat(depth)}${']'.repeat(depth)}}`;
  checkError(`arrays nested ${depth} deep`, await request('POST', C, nestedArrays), 400,
             ['depth', 'nest', 'deep', 'json', 'messages']);
  const nestedObjects = `{"model": ${JSON.stringify(model)}, "messages": [{"role": "user", "content": "hi"}], ` +
      `"tools": [{"type": "function", "function": {"name": "f", "parameters": ${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}}}]}`;
  checkError(`objects nested ${depth} deep`, await request('POST', C, nestedObjects), 400,
             ['depth', 'nest', 'deep', 'json', 'tools']);

  checkError('unknown path', await request('GET', '/v1/nope'), 404, null);
  r = await request('GET', '/v1/nope');
  check(r.json && r.json.error && r.json.error.code === 'not_found', 'unknown path: code not_found', show(r.text));
  r = await request('GET', C);
  checkError('GET on a POST route', r, 405, null);
  check(r.headers && /POST/.test(r.headers.allow || ''), '405 has Allow: POST', show(r.headers));
  checkError('DELETE /v1/models', await request('DELETE', '/v1/models'), 405, null);

  r = await request('POST', C, chat({}), { 'Content-Type': 'text/plain' });
  check(!r.error && (r.status === 200 || r.status === 400 || r.status === 415),
        `valid JSON as text/plain -> 200, 400 or 415 (got ${r.status})`, show(r.text || r.error));
  if (!r.error && r.status !== 200) checkError('valid JSON as text/plain', r, r.status, ['content-type', 'json']);

  r = await request('GET', '/v1/models', undefined, { 'X-Huge': 'x'.repeat(100 << 10) });
  check(!r.error && r.status === 431, 'a 100 KiB header -> 431', show(r.text || r.error));

  const hostile = sent - 1;  // less GET /v1/models
  // Still alive and serving.
  r = await request('GET', '/health');
  check(r.status === 200 && r.json && r.json.status === 'ok', 'GET /health -> 200 {"status":"ok"} afterwards',
        show(r.text || r.error));
  r = await request('POST', C, chat({ max_tokens: 4, temperature: 0 }));
  check(r.status === 200 && r.json && r.json.choices && r.json.choices[0].message.role === 'assistant',
        'a normal chat request succeeds afterwards', show(r.text || r.error));

  console.log(failures ? `${failures} check(s) failed` : `all checks passed (${hostile} hostile requests)`);
  process.exit(failures ? 1 : 0);
})();
