// End-to-end tests of the node's OpenAI-compatible HTTP API with the official `openai` SDK.
//   node sdk_test.js BASE_URL              against a real node (the tiny random model dsv4-tiny)
//   node sdk_test.js BASE_URL --scripted   against a test node that plays scripts.json
// Environment (all optional):
//   DSV4_API_KEY   the node's API key (--api-key-file); also checks that a wrong key gets 401
//   DSV4_GRPC      host:port of the node's gRPC API: seeded sampling must match it token for token
//   DSV4_METRICS   host:port of the node's /metrics: a cancelled stream must leave nothing running
// Prints `ok  what` / `FAIL what` lines and exits 1 on any failure.
'use strict';
const path = require('path');
const { isDeepStrictEqual } = require('util');
const OpenAI = require('openai');

const BASE_URL = process.argv[2];
const SCRIPTED = process.argv.includes('--scripted');
if (!BASE_URL) {
  console.error('usage: node sdk_test.js BASE_URL [--scripted]');
  process.exit(2);
}
const API_KEY = process.env.DSV4_API_KEY || '';
const client = new OpenAI({ baseURL: BASE_URL + '/v1', apiKey: API_KEY || 'none', maxRetries: 0,
                            timeout: 60000 });

// ---------------------------------------------------------------------------------------------
// Helpers

let failures = 0;
function check(cond, what, detail) {
  console.log(`${cond ? 'ok  ' : 'FAIL'} ${what}${!cond && detail !== undefined ? `  -- ${detail}` : ''}`);
  if (!cond) failures++;
  return cond;
}
function show(v) {
  const s = JSON.stringify(v);
  return s !== undefined && s.length > 400 ? s.slice(0, 400) + '…' : s;
}
function describe(e) {
  if (e instanceof OpenAI.APIError) {
    return `${e.constructor.name} status=${e.status} code=${e.code} param=${e.param}: ${e.message}`;
  }
  return String((e && e.stack) || e);
}
// Runs one group of checks; an exception fails the group instead of ending the run.
async function section(name, fn) {
  console.log(`# ${name}`);
  try {
    await fn();
  } catch (e) {
    check(false, `${name}: unexpected exception`, describe(e));
  }
}
// Awaits `fn()` and expects it to throw an APIError of `status`; returns the error (or null).
async function expectApiError(fn, status, what) {
  try {
    const r = await fn();
    check(false, what, `expected an APIError with status ${status}, got a response: ${show(r)}`);
    return null;
  } catch (e) {
    if (!check(e instanceof OpenAI.APIError && e.status === status, what,
               `expected an APIError with status ${status}, got ${describe(e)}`)) {
      return null;
    }
    return e;
  }
}
const isNullish = (v) => v === null || v === undefined;
const emptyContent = (v) => v === null || v === undefined || v === '';
// Markup that must never reach a client: DSML, think tags, the end-of-sentence token's text.
const MARKUP = ['｜DSML｜', '<think>', '</think>', '<｜end▁of▁sentence｜>', '<｜begin▁of▁sentence｜>'];
function leakedMarkup(...texts) {
  for (const t of texts) {
    if (typeof t !== 'string') continue;
    for (const m of MARKUP) if (t.includes(m)) return m;
  }
  return null;
}

// Collects a chat or completions stream: the chunks, the concatenated deltas, tool-call deltas,
// finish reasons, the usage chunk and the error the stream threw (if any).
async function collect(stream, { stopAfter = Infinity } = {}) {
  const out = { chunks: [], reasoning: '', content: '', text: '', toolDeltas: [], finishes: [],
                usage: null, usageIndex: -1, error: null, sawReasoning: false, logprobs: [] };
  try {
    for await (const chunk of stream) {
      out.chunks.push(chunk);
      if (chunk.usage) {
        out.usage = chunk.usage;
        out.usageIndex = out.chunks.length - 1;
      }
      for (const c of chunk.choices || []) {
        const d = c.delta || {};
        if (typeof d.reasoning_content === 'string') {
          out.reasoning += d.reasoning_content;
          out.sawReasoning = true;
        }
        if (typeof d.content === 'string') out.content += d.content;
        if (typeof c.text === 'string') out.text += c.text;  // legacy completions
        for (const t of d.tool_calls || []) out.toolDeltas.push(t);
        if (c.finish_reason) out.finishes.push(c.finish_reason);
        if (c.logprobs && c.logprobs.content) out.logprobs.push(...c.logprobs.content);
      }
      if (out.chunks.length >= stopAfter) break;
    }
  } catch (e) {
    out.error = e;
  }
  return out;
}

// Creates a stream with `create` and collects it; an error from create itself (an HTTP error
// status before the stream started) is reported as the stream's error.
async function streamed(create) {
  let stream;
  try {
    stream = await create();
  } catch (e) {
    return { chunks: [], reasoning: '', content: '', text: '', toolDeltas: [], finishes: [], usage: null,
             usageIndex: -1, error: e, sawReasoning: false, logprobs: [] };
  }
  return collect(stream);
}

// Checks the framing every stream must have: one id and the chunk object on every chunk, exactly
// one chunk with a finish_reason, and (when usage was asked for) a last chunk with choices: [].
function checkStreamShape(what, s, { object, finish, usage = true }) {
  check(s.error === null, `${what}: stream ends without an error`, s.error && describe(s.error));
  check(s.chunks.length > 0, `${what}: stream has chunks`);
  const ids = new Set(s.chunks.map((c) => c.id));
  check(ids.size === 1 && typeof s.chunks[0].id === 'string' && s.chunks[0].id.length > 0,
        `${what}: every chunk has the same id`, show([...ids]));
  const objects = new Set(s.chunks.map((c) => c.object));
  check(objects.size === 1 && objects.has(object), `${what}: every chunk is ${object}`,
        show([...objects]));
  check(s.finishes.length === 1, `${what}: exactly one chunk has a finish_reason`, show(s.finishes));
  if (finish !== undefined) {
    check(s.finishes[0] === finish, `${what}: finish_reason ${finish}`, show(s.finishes));
  }
  if (usage) {
    const last = s.chunks[s.chunks.length - 1];
    check(s.usage !== null && s.usageIndex === s.chunks.length - 1 &&
          Array.isArray(last.choices) && last.choices.length === 0,
          `${what}: the usage chunk (choices: []) comes last`,
          `usage at chunk ${s.usageIndex} of ${s.chunks.length}; last chunk ${show(last)}`);
    const withUsage = s.chunks.filter((c) => c.usage);
    check(withUsage.length === 1, `${what}: one chunk carries usage`, `${withUsage.length} do`);
  } else {
    check(!s.chunks.some((c) => Array.isArray(c.choices) && c.choices.length === 0),
          `${what}: no usage chunk without stream_options.include_usage`);
  }
}

function checkUsage(what, usage, { completion, reasoning } = {}) {
  if (!check(usage && typeof usage === 'object', `${what}: has usage`, show(usage))) return;
  check(Number.isInteger(usage.prompt_tokens) && usage.prompt_tokens > 0,
        `${what}: usage.prompt_tokens > 0`, show(usage));
  if (completion !== undefined) {
    check(usage.completion_tokens === completion, `${what}: usage.completion_tokens = ${completion}`,
          show(usage));
  }
  check(usage.total_tokens === usage.prompt_tokens + usage.completion_tokens,
        `${what}: usage.total_tokens = prompt + completion`, show(usage));
  if (reasoning !== undefined) {
    const details = usage.completion_tokens_details;
    check(details && details.reasoning_tokens === reasoning,
          `${what}: usage.completion_tokens_details.reasoning_tokens = ${reasoning}`, show(usage));
  }
}

// Assembles streamed tool-call deltas, checking the conventions of design §6.2: the first delta of
// call k has index k, an id, type "function", the name and arguments ""; later deltas of that call
// carry only arguments fragments.
function assembleToolCalls(deltas) {
  const calls = [];
  const problems = [];
  for (const t of deltas) {
    const k = t.index;
    if (!Number.isInteger(k) || k < 0) {
      problems.push(`delta without a valid index: ${show(t)}`);
      continue;
    }
    const fn = t.function || {};
    if (!calls[k]) {
      if (k !== calls.length) problems.push(`call ${k} starts before call ${calls.length}`);
      if (typeof t.id !== 'string' || t.id.length === 0) problems.push(`first delta of call ${k} has no id: ${show(t)}`);
      if (t.type !== 'function') problems.push(`first delta of call ${k} lacks type "function": ${show(t)}`);
      if (typeof fn.name !== 'string' || fn.name.length === 0) problems.push(`first delta of call ${k} has no name: ${show(t)}`);
      if (fn.arguments !== '') problems.push(`first delta of call ${k} should have arguments "": ${show(t)}`);
      calls[k] = { id: t.id, type: t.type, function: { name: fn.name, arguments: fn.arguments || '' } };
    } else {
      if (!isNullish(t.id) || !isNullish(t.type) || !isNullish(fn.name)) {
        problems.push(`a later delta of call ${k} repeats id/type/name: ${show(t)}`);
      }
      if (typeof fn.arguments !== 'string') problems.push(`a later delta of call ${k} has no arguments string: ${show(t)}`);
      else calls[k].function.arguments += fn.arguments;
    }
  }
  return { calls: calls.filter(Boolean), problems };
}

// Checks tool calls (non-streamed message.tool_calls or assembled deltas) against the expected
// [[name, argumentsObject], ...].
function checkToolCalls(what, calls, expected) {
  calls = calls || [];
  if (!check(calls.length === expected.length, `${what}: ${expected.length} tool call(s)`,
             show(calls))) {
    return;
  }
  const ids = new Set();
  expected.forEach(([name, args], i) => {
    const c = calls[i];
    check(typeof c.id === 'string' && c.id.length > 0 && !ids.has(c.id),
          `${what}: call ${i} has a unique id`, show(c));
    ids.add(c.id);
    check(c.type === 'function', `${what}: call ${i} type function`, show(c));
    check(c.function && c.function.name === name, `${what}: call ${i} name ${name}`, show(c));
    let parsed;
    try {
      parsed = JSON.parse(c.function.arguments);
    } catch (e) {
      check(false, `${what}: call ${i} arguments are JSON`, show(c.function.arguments));
      return;
    }
    check(isDeepStrictEqual(parsed, args), `${what}: call ${i} arguments = ${show(args)}`,
          `got ${c.function.arguments}`);
  });
}

// Token-level access to the gRPC API (an independent client: @grpc/grpc-js + proto-loader from
// tests/node_client, the same as client_test.js).
function grpcClient() {
  if (!process.env.DSV4_GRPC) return null;
  const nm = path.join(__dirname, '..', 'node_client', 'node_modules');
  const grpc = require(path.join(nm, '@grpc', 'grpc-js'));
  const loader = require(path.join(nm, '@grpc', 'proto-loader'));
  const opts = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
                 includeDirs: [path.join(__dirname, '..', '..', 'proto')] };
  const api = grpc.loadPackageDefinition(loader.loadSync('dsv4/v1/dsv4.proto', opts)).dsv4.v1;
  const stub = new api.Dsv4(process.env.DSV4_GRPC, grpc.credentials.createInsecure());
  const generate = (request) => new Promise((resolve) => {
    const call = stub.Generate(request, { deadline: new Date(Date.now() + 30000) });
    const out = { tokens: [], text: '', finished: null, error: null };
    call.on('data', (r) => {
      if (r.chunk) {
        out.tokens.push(...r.chunk.token_ids);
        out.text += r.chunk.text;
      }
      if (r.finished) out.finished = r.finished;
    });
    call.on('error', (e) => { out.error = e; });
    call.on('status', () => resolve(out));
  });
  return { generate, close: () => stub.close() };
}

async function metricsText() {
  const res = await fetch(`http://${process.env.DSV4_METRICS}/metrics`);
  return res.text();
}
// Sum of every sample of `name` whose labels contain all of `labels` (e.g. 'finish_reason="cancelled"').
function metricSum(text, name, ...labels) {
  let sum = null;
  for (const line of text.split('\n')) {
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/);
    if (!m || m[1] !== name) continue;
    if (!labels.every((l) => (m[2] || '').includes(l))) continue;
    sum = (sum || 0) + Number(m[3]);
  }
  return sum;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------------------------------------
// Shared request pieces

const GET_WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Get current weather',
    parameters: { type: 'object',
                  properties: { city: { type: 'string' },
                                unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
                  required: ['city'] },
  },
};
const CREATE_EVENT = {
  type: 'function',
  function: {
    name: 'create_event', description: 'Create a calendar event',
    parameters: { type: 'object',
                  properties: { title: { type: 'string' }, details: { type: 'object' } },
                  required: ['title'] },
  },
};
const GET_TIME = {
  type: 'function',
  function: { name: 'get_time', description: 'Current time',
              parameters: { type: 'object', properties: {} } },
};
const HELLO = [{ role: 'user', content: 'Hello, who are you?' }];
const WEATHER_MESSAGES = [{ role: 'system', content: 'You are a helpful assistant.' },
                          { role: 'user', content: "What's the weather in Paris?" }];
const THINKING_OFF = { chat_template_kwargs: { thinking: false } };
const STREAM = { stream: true, stream_options: { include_usage: true } };
// Token ids of client_test.js's Generate prompt (and its greedy continuation).
const PROMPT_IDS = [263, 1015, 148, 447, 146];

// ---------------------------------------------------------------------------------------------
// Against the real node

async function realTests(model, maxModelLen) {
  const grpc = grpcClient();

  await section('non-streamed chat, greedy, thinking on/off', async () => {
    const base = { model, messages: HELLO, temperature: 0, max_tokens: 8 };
    const on = await client.chat.completions.create(base);
    check(typeof on.id === 'string' && on.id.startsWith('chatcmpl-'), 'chat id starts chatcmpl-', on.id);
    check(on.object === 'chat.completion', 'object chat.completion', on.object);
    check(on.model === model, `model echoes ${model}`, on.model);
    check(Number.isInteger(on.created) && on.created > 1.6e9, 'created is a unix time', on.created);
    check(on.choices.length === 1 && on.choices[0].index === 0, 'one choice, index 0', show(on.choices));
    const c = on.choices[0];
    check(c.finish_reason === 'length', 'max_tokens 8 -> finish_reason length',
          `${c.finish_reason} (if stop: the tiny model ended early; pick another prompt)`);
    check(c.message.role === 'assistant', 'message.role assistant', c.message.role);
    check(typeof c.message.reasoning_content === 'string' && c.message.reasoning_content.length > 0,
          'thinking on (default): the text is in message.reasoning_content', show(c.message));
    check(emptyContent(c.message.content), 'thinking on: content null or ""', show(c.message.content));
    checkUsage('thinking on', on.usage, { completion: 8, reasoning: 8 });

    const enabled = await client.chat.completions.create({ ...base, thinking: { type: 'enabled' } });
    check(enabled.choices[0].message.reasoning_content === c.message.reasoning_content,
          "thinking: {type: 'enabled'} = the default",
          show([enabled.choices[0].message, c.message]));

    const off = await client.chat.completions.create({ ...base, ...THINKING_OFF });
    const m = off.choices[0].message;
    check(typeof m.content === 'string' && m.content.length > 0,
          'chat_template_kwargs.thinking false: the text is in content', show(m));
    check(isNullish(m.reasoning_content), 'thinking off: no reasoning_content', show(m));
    check(off.choices[0].finish_reason === 'length', 'thinking off: finish_reason length',
          off.choices[0].finish_reason);
    checkUsage('thinking off', off.usage, { completion: 8, reasoning: 0 });
    for (const [label, extra] of [["thinking: {type: 'disabled'}", { thinking: { type: 'disabled' } }],
                                  ["reasoning_effort: 'none'", { reasoning_effort: 'none' }]]) {
      const r = await client.chat.completions.create({ ...base, ...extra });
      check(r.choices[0].message.content === m.content && isNullish(r.choices[0].message.reasoning_content),
            `${label} = chat_template_kwargs.thinking false`, show([r.choices[0].message, m]));
    }

    const mct = await client.chat.completions.create({ model, messages: HELLO, temperature: 0,
                                                       max_completion_tokens: 4 });
    check(mct.usage.completion_tokens === 4 && mct.choices[0].finish_reason === 'length',
          'max_completion_tokens 4 -> 4 tokens, length', show(mct.usage));

    const parts = await client.chat.completions.create({
      model, temperature: 0, max_tokens: 2,
      messages: [{ role: 'system', content: [{ type: 'text', text: 'Be brief.' }] },
                 { role: 'developer', content: 'Answer in English.' },
                 { role: 'user', content: [{ type: 'text', text: 'Hello, ' }, { type: 'text', text: 'who are you?' }] }],
    });
    check(parts.choices[0].message.role === 'assistant',
          'system + developer + content as an array of text parts -> 200');

    if (grpc) {
      // The HTTP API renders plain chat messages exactly as the gRPC ChatInput does.
      for (const thinking of [true, false]) {
        const g = await grpc.generate({ chat: { messages: [{ role: 'user', content: HELLO[0].content }], thinking },
                                        max_tokens: 8 });
        const http = thinking ? c.message.reasoning_content : m.content;
        check(!g.error && g.text === http, `thinking ${thinking}: same text as gRPC Generate(chat)`,
              `gRPC ${show(g.text)} ${g.error || ''} vs HTTP ${show(http)}`);
        const usage = thinking ? on.usage : off.usage;
        check(g.finished && g.finished.usage.prompt_tokens === usage.prompt_tokens,
              `thinking ${thinking}: same prompt_tokens as gRPC Generate(chat)`,
              `${g.finished && g.finished.usage.prompt_tokens} vs ${usage.prompt_tokens}`);
      }
    }

    await section('streamed chat = non-streamed', async () => {
      const son = await streamed(() => client.chat.completions.create({ ...base, ...STREAM }));
      checkStreamShape('stream thinking on', son, { object: 'chat.completion.chunk', finish: 'length' });
      const first = son.chunks[0] && son.chunks[0].choices[0];
      check(first && first.delta.role === 'assistant', 'stream: first delta has role assistant',
            show(son.chunks[0]));
      check(son.reasoning === c.message.reasoning_content,
            'stream thinking on: reasoning_content deltas = non-streamed reasoning_content',
            show([son.reasoning, c.message.reasoning_content]));
      check(son.content === (c.message.content || ''), 'stream thinking on: content deltas = non-streamed content',
            show(son.content));
      check(son.usage && isDeepStrictEqual(son.usage, on.usage), 'stream thinking on: usage = non-streamed usage',
            show([son.usage, on.usage]));
      check(son.chunks.every((k) => k.model === model), `stream: every chunk names model ${model}`);

      const soff = await streamed(() => client.chat.completions.create({ ...base, ...THINKING_OFF, ...STREAM }));
      checkStreamShape('stream thinking off', soff, { object: 'chat.completion.chunk', finish: 'length' });
      check(soff.content === m.content, 'stream thinking off: content deltas = non-streamed content',
            show([soff.content, m.content]));
      check(!soff.sawReasoning, 'stream thinking off: no reasoning_content deltas');
      check(soff.usage && soff.usage.completion_tokens === 8 &&
            soff.usage.completion_tokens_details.reasoning_tokens === 0,
            'stream thinking off: usage 8 tokens, 0 reasoning', show(soff.usage));

      const nousage = await streamed(() => client.chat.completions.create({ ...base, stream: true }));
      checkStreamShape('stream without include_usage', nousage,
                       { object: 'chat.completion.chunk', finish: 'length', usage: false });
    });

    await section('stop string', async () => {
      const long = await client.chat.completions.create({ ...base, ...THINKING_OFF, max_tokens: 16 });
      const text = long.choices[0].message.content || '';
      // A short run of ASCII letters/digits from the middle of the greedy output.
      const from = Math.floor(text.length / 3);
      const found = text.slice(from).match(/[A-Za-z0-9]{2,3}/);
      if (!check(found !== null, 'greedy output has an ASCII substring to use as a stop string', show(text))) return;
      const stop = found[0];
      const expected = text.slice(0, text.indexOf(stop));
      const r = await client.chat.completions.create({ ...base, ...THINKING_OFF, max_tokens: 16, stop: [stop] });
      check(r.choices[0].message.content === expected,
            `stop ${show(stop)}: output ends before it`, show([r.choices[0].message.content, expected]));
      check(r.choices[0].finish_reason === 'stop', `stop ${show(stop)}: finish_reason stop`,
            r.choices[0].finish_reason);
      check(r.usage.completion_tokens < 16, 'stop: fewer than max_tokens tokens', show(r.usage));
      const s = await streamed(() => client.chat.completions.create({ ...base, ...THINKING_OFF, max_tokens: 16,
                                                                    stop, ...STREAM }));
      check(s.content === expected && s.finishes[0] === 'stop',
            `streamed stop ${show(stop)} (a string): the same text, finish_reason stop`,
            show([s.content, s.finishes]));
    });
  });

  await section('seeded sampling', async () => {
    const req = { model, messages: HELLO, temperature: 0.8, seed: 1234, max_tokens: 16, ...THINKING_OFF };
    const a = await client.chat.completions.create(req);
    const b = await client.chat.completions.create(req);
    check(a.choices[0].message.content === b.choices[0].message.content,
          'chat, temperature 0.8 seed 1234 twice: identical text',
          show([a.choices[0].message.content, b.choices[0].message.content]));
    const greedy = await client.chat.completions.create({ ...req, temperature: 0 });
    check(greedy.choices[0].message.content !== a.choices[0].message.content,
          'seeded sampling differs from greedy (sampling is on)');

    const cp = { model, prompt: PROMPT_IDS, temperature: 0.8, seed: 1234, max_tokens: 16 };
    const c1 = await client.completions.create(cp);
    const c2 = await client.completions.create(cp);
    check(c1.choices[0].text === c2.choices[0].text, 'completions, seed 1234 twice: identical text',
          show([c1.choices[0].text, c2.choices[0].text]));
    if (!grpc) {
      console.log('skip comparison with the gRPC API (DSV4_GRPC not set)');
      return;
    }
    const gc = await grpc.generate({ chat: { messages: [{ role: 'user', content: HELLO[0].content }], thinking: false },
                                     max_tokens: 16, sampling: { temperature: 0.8, seed: 1234 } });
    check(!gc.error && gc.text === a.choices[0].message.content,
          'chat(temperature 0.8, seed 1234, thinking off) = gRPC Generate(chat) text',
          `HTTP ${show(a.choices[0].message.content)} vs gRPC ${show(gc.text)} ${gc.error || ''}`);
    const g = await grpc.generate({ token_ids: { ids: PROMPT_IDS }, max_tokens: 16,
                                    sampling: { temperature: 0.8, seed: 1234 } });
    check(!g.error && g.text === c1.choices[0].text,
          'completions(token ids, temperature 0.8, seed 1234) = gRPC Generate text',
          `HTTP ${show(c1.choices[0].text)} vs gRPC ${show(g.text)} ${g.error || ''}`);
    check(c1.usage.completion_tokens === g.tokens.length && c1.usage.prompt_tokens === PROMPT_IDS.length,
          'completions usage = gRPC token counts', `${show(c1.usage)} vs ${g.tokens.length}`);
  });

  await section('legacy completions', async () => {
    const base = { model, prompt: 'Hello world', temperature: 0, max_tokens: 8 };
    const r = await client.completions.create(base);
    check(r.object === 'text_completion', 'object text_completion', r.object);
    check(typeof r.id === 'string' && r.id.length > 0, 'completion has an id', r.id);
    check(r.choices.length === 1 && typeof r.choices[0].text === 'string' && r.choices[0].text.length > 0,
          'string prompt: choices[0].text', show(r.choices));
    check(r.choices[0].finish_reason === 'length', 'string prompt: finish_reason length', r.choices[0].finish_reason);
    checkUsage('completions string prompt', r.usage, { completion: 8 });
    const s = await streamed(() => client.completions.create({ ...base, ...STREAM }));
    checkStreamShape('completions stream', s, { object: 'text_completion', finish: 'length' });
    check(s.text === r.choices[0].text, 'streamed completion text = non-streamed', show([s.text, r.choices[0].text]));

    const ids = await client.completions.create({ ...base, prompt: PROMPT_IDS });
    check(ids.usage.prompt_tokens === PROMPT_IDS.length, 'token-id prompt: prompt_tokens = its length',
          show(ids.usage));
    check(ids.usage.completion_tokens === 8 && ids.choices[0].finish_reason === 'length',
          'token-id prompt: 8 tokens, length', show(ids.usage));
    const sids = await streamed(() => client.completions.create({ ...base, prompt: PROMPT_IDS, ...STREAM }));
    checkStreamShape('completions stream (token ids)', sids, { object: 'text_completion', finish: 'length' });
    check(sids.text === ids.choices[0].text, 'streamed token-id completion = non-streamed',
          show([sids.text, ids.choices[0].text]));
    if (grpc) {
      const g = await grpc.generate({ token_ids: { ids: PROMPT_IDS }, max_tokens: 8 });
      check(g.text === ids.choices[0].text, 'greedy token-id completion = gRPC Generate text',
            show([ids.choices[0].text, g.text]));
    }
  });

  await section('logprobs', async () => {
    const r = await client.completions.create({ model, prompt: 'Hello world', temperature: 0, max_tokens: 8,
                                                logprobs: 2 });
    const lp = r.choices[0].logprobs;
    const n = r.usage.completion_tokens;
    if (check(lp && typeof lp === 'object', 'completions logprobs: 2 -> choices[0].logprobs', show(r.choices[0]))) {
      for (const key of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset']) {
        check(Array.isArray(lp[key]) && lp[key].length === n, `completions logprobs.${key}: ${n} entries`,
              show(lp[key]));
      }
      check((lp.token_logprobs || []).every((x) => typeof x === 'number' && x <= 0),
            'token_logprobs are numbers <= 0', show(lp.token_logprobs));
      check((lp.top_logprobs || []).every((o) => o && typeof o === 'object' && !Array.isArray(o) &&
                                             Object.keys(o).length >= 1 && Object.keys(o).length <= 3 &&
                                             Object.values(o).every((x) => typeof x === 'number' && x <= 0)),
            'top_logprobs are {token: logprob} objects of up to 2 (+ the chosen) entries', show(lp.top_logprobs));
      check((lp.top_logprobs || []).every((o, i) =>
              o && Math.abs(Math.max(...Object.values(o)) - lp.token_logprobs[i]) < 1e-3),
            'greedy: each chosen logprob is the best of top_logprobs');
      check((lp.text_offset || []).every((x, i, a) => Number.isInteger(x) && (i === 0 || x >= a[i - 1])),
            'text_offset non-decreasing integers', show(lp.text_offset));
    }

    const chat = await client.chat.completions.create({ model, messages: HELLO, temperature: 0, max_tokens: 8,
                                                        ...THINKING_OFF, logprobs: true, top_logprobs: 2 });
    const content = chat.choices[0].logprobs && chat.choices[0].logprobs.content;
    const m = chat.usage.completion_tokens;
    if (check(Array.isArray(content) && content.length === m,
              `chat logprobs: choices[0].logprobs.content has ${m} entries`, show(chat.choices[0].logprobs))) {
      check(content.every((e) => typeof e.token === 'string' && typeof e.logprob === 'number' && e.logprob <= 0),
            'chat logprobs entries have token and logprob <= 0', show(content[0]));
      check(content.every((e) => Array.isArray(e.top_logprobs) && e.top_logprobs.length === 2 &&
                                 e.top_logprobs.every((t) => typeof t.token === 'string' && typeof t.logprob === 'number')),
            'chat logprobs entries have top_logprobs of length 2', show(content[0]));
    }
  });

  await section('tools on the real model', async () => {
    const base = { model, messages: WEATHER_MESSAGES, temperature: 0, max_tokens: 16 };
    const plain = await client.chat.completions.create(base);
    const auto = await client.chat.completions.create({ ...base, tools: [GET_WEATHER], tool_choice: 'auto' });
    const am = auto.choices[0].message;
    check(['stop', 'length', 'tool_calls'].includes(auto.choices[0].finish_reason),
          'tools + auto: finish_reason stop/length/tool_calls', auto.choices[0].finish_reason);
    check(!`${am.content || ''}${am.reasoning_content || ''}`.includes('｜DSML｜'),
          'tools + auto: no DSML markup in content or reasoning_content', show(am));
    check(auto.usage.prompt_tokens > plain.usage.prompt_tokens,
          'tools + auto: prompt_tokens > without tools (the tools block is in the prompt)',
          `${auto.usage.prompt_tokens} vs ${plain.usage.prompt_tokens}`);
    const dflt = await client.chat.completions.create({ ...base, tools: [GET_WEATHER] });
    check(dflt.usage.prompt_tokens === auto.usage.prompt_tokens, 'tools without tool_choice = auto (prompt_tokens)',
          `${dflt.usage.prompt_tokens} vs ${auto.usage.prompt_tokens}`);
    const none = await client.chat.completions.create({ ...base, tools: [GET_WEATHER], tool_choice: 'none' });
    check(none.usage.prompt_tokens === plain.usage.prompt_tokens,
          "tool_choice 'none': prompt_tokens = without tools (tools left out of the prompt)",
          `${none.usage.prompt_tokens} vs ${plain.usage.prompt_tokens}`);
    check(isNullish(none.choices[0].message.tool_calls) || none.choices[0].message.tool_calls.length === 0,
          "tool_choice 'none': no tool_calls", show(none.choices[0].message));
    const s = await streamed(() => client.chat.completions.create({ ...base, tools: [GET_WEATHER], ...STREAM }));
    checkStreamShape('tools stream', s, { object: 'chat.completion.chunk' });
    check(!(s.content + s.reasoning).includes('｜DSML｜'), 'tools stream: no DSML markup in the deltas');

    const history = [
      ...WEATHER_MESSAGES,
      { role: 'assistant', content: null, reasoning_content: 'The user wants Paris weather. Call get_weather.',
        tool_calls: [{ id: 'call_a1', type: 'function',
                       function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_a1', content: '{"temp_c": 18, "sky": "cloudy"}' },
    ];
    const round = await client.chat.completions.create({ ...base, messages: history, tools: [GET_WEATHER] });
    check(round.choices.length === 1 && round.choices[0].finish_reason,
          'tool-result round trip (assistant tool_calls + role tool) -> 200', show(round.choices));
    check(round.usage.prompt_tokens > auto.usage.prompt_tokens,
          'round trip: the call and its result are in the prompt',
          `${round.usage.prompt_tokens} vs ${auto.usage.prompt_tokens}`);
    const withObject = await client.chat.completions.create({
      ...base, tools: [GET_WEATHER],
      messages: [history[0], history[1],
                 { ...history[2], tool_calls: [{ id: 'call_a1', type: 'function',
                                                 function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
                 history[3]],
    });
    check(withObject.usage.prompt_tokens === round.usage.prompt_tokens,
          'history arguments are re-rendered from the parsed JSON (compact JSON = spaced JSON)',
          `${withObject.usage.prompt_tokens} vs ${round.usage.prompt_tokens}`);
  });

  await section('errors through the SDK', async () => {
    const e = await expectApiError(() => client.chat.completions.create({ model: 'no-such-model', messages: HELLO,
                                                                          max_tokens: 1 }),
                                   404, 'chat for another model -> 404');
    if (e) {
      check(e instanceof OpenAI.NotFoundError && e.code === 'model_not_found',
            '404 is a NotFoundError with code model_not_found', describe(e));
    }
    const ce = await expectApiError(() => client.completions.create({ model: 'no-such-model', prompt: 'x',
                                                                      max_tokens: 1 }),
                                    404, 'completions for another model -> 404');
    if (ce) check(ce.code === 'model_not_found', 'completions 404 code model_not_found', describe(ce));
    const n2 = await expectApiError(() => client.chat.completions.create({ model, messages: HELLO, n: 2 }),
                                    400, 'n 2 -> 400');
    if (n2) check(n2 instanceof OpenAI.BadRequestError && n2.param === 'n' && n2.type === 'invalid_request_error',
                  'n 2: BadRequestError, param n, type invalid_request_error', describe(n2));
    const role = await expectApiError(() => client.chat.completions.create({
      model, messages: [{ role: 'wizard', content: 'hi' }] }), 400, 'unknown role -> 400');
    if (role) check(role.param === 'messages[0].role', 'unknown role: param messages[0].role', describe(role));
  });

  await section('cancellation', async () => {
    if (!process.env.DSV4_METRICS) {
      console.log('skip cancellation (DSV4_METRICS not set)');
      return;
    }
    const before = metricSum(await metricsText(), 'dsv4_requests_finished_total', 'finish_reason="cancelled"');
    check(before !== null, 'metrics has dsv4_requests_finished_total{finish_reason="cancelled"}');
    // max_tokens 2000 does not fit --max-model-len 1024: ask for as many as fit.
    const maxTokens = Math.min(2000, maxModelLen - 64);
    const stream = await client.chat.completions.create({ model, messages: HELLO, max_tokens: maxTokens,
                                                          ignore_eos: true, stream: true });
    let n = 0;
    try {
      for await (const chunk of stream) { // eslint-disable-line no-unused-vars
        if (++n === 3) {
          stream.controller.abort();
          break;
        }
      }
    } catch (e) {
      if (!(e instanceof OpenAI.APIUserAbortError) && !(e && e.name === 'AbortError')) throw e;
    }
    check(n === 3, 'read 3 chunks, then aborted the stream', `read ${n}`);
    const t0 = Date.now();
    let running = null;
    let cancelled = null;
    while (Date.now() - t0 < 5000) {
      const text = await metricsText();
      running = metricSum(text, 'dsv4_num_requests_running');
      cancelled = metricSum(text, 'dsv4_requests_finished_total', 'finish_reason="cancelled"');
      if (running === 0 && cancelled > before) break;
      await sleep(100);
    }
    check(running === 0, `dsv4_num_requests_running is 0 within 5 s of the abort (${Date.now() - t0} ms)`,
          `still ${running}`);
    check(cancelled > before, 'the aborted request finished as cancelled (not run to max_tokens)',
          `cancelled ${before} -> ${cancelled}`);
  });

  await section('API key', async () => {
    if (!API_KEY) {
      console.log('skip API key checks (DSV4_API_KEY not set)');
      return;
    }
    const wrong = new OpenAI({ baseURL: BASE_URL + '/v1', apiKey: 'wrong-' + API_KEY, maxRetries: 0,
                               timeout: 60000 });
    for (const [what, fn] of [['models.list', () => wrong.models.list()],
                              ['chat', () => wrong.chat.completions.create({ model, messages: HELLO, max_tokens: 1 })],
                              ['completions', () => wrong.completions.create({ model, prompt: 'x', max_tokens: 1 })]]) {
      const e = await expectApiError(fn, 401, `${what} with a wrong key -> 401`);
      if (e) {
        check(e instanceof OpenAI.AuthenticationError && e.code === 'invalid_api_key',
              `${what}: AuthenticationError, code invalid_api_key`, describe(e));
      }
    }
  });

  if (grpc) grpc.close();
}

// ---------------------------------------------------------------------------------------------
// Against the scripted test node: the fake model generates scripts.json[NAME] for a prompt whose
// last user message contains [[script:NAME]].

const SCRIPT_TOOLS = [GET_WEATHER, CREATE_EVENT, GET_TIME];
const ROME_SYNC = [['get_weather', { city: 'Rome', unit: 'fahrenheit' }],
                   ['create_event', { title: 'Team sync: "Q3" <draft>',
                                      details: { duration_min: 30, attendees: ['ana', 'bo'] } }]];
// What each script must come out as. thinking false: the request turns thinking off.
const EXPECT = {
  weather_paris: { reasoning: 'The user wants Paris weather. Call get_weather.', content: null,
                   calls: [['get_weather', { city: 'Paris' }]] },
  two_calls: { reasoning: 'The user wants Rome in fahrenheit and a sync with Ana and Bo.', content: null,
               calls: ROME_SYNC },
  chat_call: { thinking: false, content: 'Let me check.', calls: [['get_weather', { city: 'Oslo' }]] },
  plain: { reasoning: 'Got the data.', content: 'It is 18°C and cloudy in Paris.', calls: [] },
  escapes: { reasoning: 'Tricky values.', content: null,
             calls: [['create_event', { title: 'Line 1\nLine "2" \\ back\tslash </b> <｜ Café 東京 😀',
                                        details: { nested: { list: [1, 2.5, null, true] }, s: 'x"y' } }]] },
  no_params: { reasoning: 'Checking the clock.', content: null, calls: [['get_time', {}]] },
  required_rest: { thinking: false, content: null, calls: [['get_weather', { city: 'Berlin' }]],
                   extra: { tool_choice: 'required' } },
  named_rest: { thinking: false, content: null, calls: [['get_weather', { city: 'Paris', unit: 'celsius' }]],
                extra: { tool_choice: { type: 'function', function: { name: 'get_weather' } } } },
};

// No max_tokens: the node's default (the room left) is enough when the scripted node runs with
// --max-model-len 4096 (the tiny tokenizer needs ~810 tokens for these tools, two_calls ~390).
function scriptRequest(model, name, { thinking = true, extra = {}, messages, tools = SCRIPT_TOOLS } = {}) {
  return {
    model, tools, temperature: 0,
    messages: messages || [{ role: 'system', content: 'You are a helpful assistant.' },
                           { role: 'user', content: `Please help. [[script:${name}]]` }],
    ...(thinking ? {} : { thinking: { type: 'disabled' } }),
    ...extra,
  };
}

function checkScriptedMessage(what, r, exp) {
  const c = r.choices[0];
  const m = c.message;
  const finish = exp.calls.length ? 'tool_calls' : 'stop';
  check(c.finish_reason === finish, `${what}: finish_reason ${finish}`, c.finish_reason);
  check(m.role === 'assistant', `${what}: role assistant`, m.role);
  if (exp.thinking === false) {
    check(isNullish(m.reasoning_content), `${what}: no reasoning_content (thinking off)`, show(m.reasoning_content));
  } else {
    check(m.reasoning_content === exp.reasoning, `${what}: reasoning_content ${show(exp.reasoning)}`,
          show(m.reasoning_content));
  }
  if (exp.content === null) check(emptyContent(m.content), `${what}: content null`, show(m.content));
  else check(m.content === exp.content, `${what}: content ${show(exp.content)}`, show(m.content));
  if (exp.calls.length) checkToolCalls(what, m.tool_calls, exp.calls);
  else check(isNullish(m.tool_calls) || m.tool_calls.length === 0, `${what}: no tool_calls`, show(m.tool_calls));
  const leak = leakedMarkup(m.content, m.reasoning_content);
  check(leak === null, `${what}: no markup in content or reasoning_content`, leak);
  checkUsage(what, r.usage);
}

function checkScriptedStream(what, s, exp) {
  const finish = exp.calls.length ? 'tool_calls' : 'stop';
  checkStreamShape(what, s, { object: 'chat.completion.chunk', finish });
  if (exp.thinking === false) check(!s.sawReasoning, `${what}: no reasoning_content deltas`);
  else check(s.reasoning === exp.reasoning, `${what}: reasoning_content deltas = ${show(exp.reasoning)}`, show(s.reasoning));
  check(s.content === (exp.content || ''), `${what}: content deltas = ${show(exp.content || '')}`, show(s.content));
  const perDelta = s.chunks.flatMap((k) => (k.choices || []).map((c) => c.delta || {}))
                           .flatMap((d) => [d.content, d.reasoning_content]);
  const leak = leakedMarkup(s.content, s.reasoning, ...perDelta);
  check(leak === null, `${what}: no markup in any content/reasoning delta`, leak);
  const { calls, problems } = assembleToolCalls(s.toolDeltas);
  check(problems.length === 0, `${what}: tool_calls deltas follow §6.2`, problems.join('; '));
  if (exp.calls.length) checkToolCalls(what, calls, exp.calls);
  else check(s.toolDeltas.length === 0, `${what}: no tool_calls deltas`, show(s.toolDeltas));
  return calls;
}

// A model-generated call that cannot be parsed: 500 server_error/invalid_tool_call naming the call
// (non-streamed), an APIError thrown by the stream (streamed); markup never reaches content.
async function checkInvalidCall(model, name, toolName) {
  const e = await expectApiError(() => client.chat.completions.create(scriptRequest(model, name)), 500,
                                 `${name}: non-streamed -> 500`);
  if (e) {
    check(e.type === 'server_error' && e.code === 'invalid_tool_call',
          `${name}: type server_error, code invalid_tool_call`, describe(e));
    check(e.message.includes(toolName), `${name}: the error message names the call ${toolName}`, e.message);
    check(e.headers && e.headers.get('x-should-retry') === 'false', `${name}: header x-should-retry: false`,
          e.headers && e.headers.get('x-should-retry'));
  }
  const s = await streamed(() => client.chat.completions.create({ ...scriptRequest(model, name), ...STREAM }));
  check(s.error instanceof OpenAI.APIError, `${name}: the stream throws an APIError`,
        s.error ? describe(s.error) : `no error; finishes ${show(s.finishes)}`);
  if (s.error instanceof OpenAI.APIError) {
    check(s.error.code === 'invalid_tool_call' && s.error.message.includes(toolName),
          `${name}: streamed error has code invalid_tool_call and names ${toolName}`, describe(s.error));
  }
  check(!s.finishes.includes('tool_calls'), `${name}: stream does not finish with tool_calls`, show(s.finishes));
  const leak = leakedMarkup(s.content, s.reasoning);
  check(leak === null, `${name}: no markup in streamed content/reasoning`, leak);
}

async function scriptedTests(model) {
  const results = {};
  for (const [name, exp] of Object.entries(EXPECT)) {
    await section(`script ${name}`, async () => {
      const req = scriptRequest(model, name, exp);
      const r = await client.chat.completions.create(req);
      checkScriptedMessage(name, r, exp);
      results[name] = r;
      const s = await streamed(() => client.chat.completions.create({ ...req, ...STREAM }));
      checkScriptedStream(`${name} streamed`, s, exp);
      check(s.usage && r.usage && s.usage.completion_tokens === r.usage.completion_tokens,
            `${name}: streamed usage = non-streamed`, show([s.usage, r.usage]));
    });
  }

  await section('reasoning tokens of a scripted call', async () => {
    const u = results.weather_paris.usage;
    const rt = u.completion_tokens_details && u.completion_tokens_details.reasoning_tokens;
    check(rt > 0 && rt < u.completion_tokens, 'weather_paris: 0 < reasoning_tokens < completion_tokens', show(u));
  });

  await section('truncated inside the tool-call block', async () => {
    // Stop a few tokens before the block's closer: no markup may leak, the finish is length.
    const max = results.weather_paris.usage.completion_tokens - 3;
    const req = { ...scriptRequest(model, 'weather_paris'), max_tokens: max };
    const r = await client.chat.completions.create(req);
    const m = r.choices[0].message;
    check(r.choices[0].finish_reason === 'length', `max_tokens ${max}: finish_reason length`, r.choices[0].finish_reason);
    check(leakedMarkup(m.content, m.reasoning_content) === null, 'truncated: no markup in content/reasoning', show(m));
    const s = await streamed(() => client.chat.completions.create({ ...req, ...STREAM }));
    check(s.error === null && s.finishes[0] === 'length', 'truncated stream: finish_reason length',
          s.error ? describe(s.error) : show(s.finishes));
    check(leakedMarkup(s.content, s.reasoning) === null, 'truncated stream: no markup in deltas',
          show([s.content, s.reasoning]));
  });

  await section('invalid tool calls', async () => {
    await checkInvalidCall(model, 'bad_json', 'create_event');
    await checkInvalidCall(model, 'unknown_tool', 'delete_everything');
  });

  await section('round trip: tool call, tool result, answer (thinking)', async () => {
    const first = results.weather_paris;
    if (!check(first && first.choices[0].message.tool_calls, 'weather_paris produced a call to send back')) return;
    const m = first.choices[0].message;
    const call = m.tool_calls[0];
    const messages = [
      { role: 'system', content: 'You are a helpful assistant.' },
      { role: 'user', content: "What's the weather in Paris? [[script:weather_paris]]" },
      { role: 'assistant', content: m.content, reasoning_content: m.reasoning_content,
        tool_calls: [{ id: call.id, type: 'function',
                       function: { name: call.function.name, arguments: call.function.arguments } }] },
      { role: 'tool', tool_call_id: call.id, content: '{"temp_c": 18, "sky": "cloudy"}' },
      { role: 'user', content: 'Thanks. [[script:plain]]' },
    ];
    const r = await client.chat.completions.create(scriptRequest(model, 'plain', { messages }));
    checkScriptedMessage('round trip', r, EXPECT.plain);
    check(r.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens,
          'round trip: the prompt holds the call and its result', `${r.usage.prompt_tokens}`);
    const s = await streamed(() => client.chat.completions.create({ ...scriptRequest(model, 'plain', { messages }),
                                                                   ...STREAM }));
    checkScriptedStream('round trip streamed', s, EXPECT.plain);
  });

  await section('round trip: tool call, tool result, answer (chat mode)', async () => {
    const first = results.chat_call;
    if (!check(first && first.choices[0].message.tool_calls, 'chat_call produced a call to send back')) return;
    const call = first.choices[0].message.tool_calls[0];
    const messages = [
      { role: 'user', content: 'Weather in Oslo? [[script:chat_call]]' },
      { role: 'assistant', content: first.choices[0].message.content, tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: '{"temp_c": -3}' },
      { role: 'user', content: 'And? [[script:chat_plain]]' },
    ];
    const r = await client.chat.completions.create(scriptRequest(model, 'chat_plain', { thinking: false, messages }));
    checkScriptedMessage('chat round trip', r, { thinking: false, content: 'It is -3°C in Oslo.', calls: [] });
  });
}

// ---------------------------------------------------------------------------------------------

(async () => {
  let model = null;
  let maxModelLen = 1024;
  await section('models', async () => {
    const list = await client.models.list();
    const data = list.data || [];
    check(data.length >= 1, 'GET /v1/models lists a model', show(data));
    const m = data[0] || {};
    model = m.id;
    check(typeof m.id === 'string' && m.id.length > 0 && m.object === 'model' && m.owned_by === 'dsv4-node' &&
          Number.isInteger(m.created), 'model entry {id, object: model, created, owned_by: dsv4-node}', show(m));
    check(Number.isInteger(m.max_model_len) && m.max_model_len > 0, 'model entry has max_model_len', show(m));
    if (Number.isInteger(m.max_model_len)) maxModelLen = m.max_model_len;
    if (!SCRIPTED) check(m.id === 'dsv4-tiny', 'the served model is dsv4-tiny', m.id);
    if (SCRIPTED) {
      check(m.max_model_len >= 2048, 'scripted node: max_model_len >= 2048 (room for tools + scripts)',
            `${m.max_model_len}: start it with --max-model-len 4096`);
    }
  });
  if (!model) {
    check(false, 'no model to test');
    process.exit(1);
  }
  if (SCRIPTED) await scriptedTests(model);
  else await realTests(model, maxModelLen);
  console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
  process.exit(failures ? 1 : 0);
})();
