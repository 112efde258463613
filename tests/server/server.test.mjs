// `mambacpp serve` driven by the official OpenAI Node client (and raw fetch for what a client would not send), on
// the shipped model on CPU. Expected outputs come from the CLI (`mambacpp generate --json`, `mambacpp logits`).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';

import { generate, logSoftmax, logits, metrics, postJson, startServer, waitFor, writeScratch } from './support.mjs';

const PROMPT = 'def parse_args(';

describe('serve --parallel 64 --max-queue 0', () => {
  let server, client;
  before(async () => {
    server = await startServer(['--parallel', '64', '--max-queue', '0']);  // a burst of 64 fits the slots exactly
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  });
  after(async () => {
    server.proc.kill('SIGTERM');
    await server.exited;
  });

  test('health and models', async () => {
    const health = await fetch(`${server.url}/health`);
    assert.equal(health.status, 200);
    const models = await client.models.list();
    assert.deepEqual(
      models.data.map((m) => m.id),
      ['default'],
    );
  });

  test('greedy completion equals `mambacpp generate --temp 0`', async () => {
    const [ref] = generate(['-p', PROMPT, '-n', '24', '--temp', '0']);
    const r = await client.completions.create({ model: 'default', prompt: PROMPT, max_tokens: 24, temperature: 0 });
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].text, ref.text);
    assert.equal(r.choices[0].finish_reason, ref.stop_reason === 'length' ? 'length' : 'stop');
    assert.equal(r.usage.prompt_tokens, ref.prompt_tokens.length);
    assert.equal(r.usage.completion_tokens, ref.tokens.length);
    assert.equal(r.usage.total_tokens, ref.prompt_tokens.length + ref.tokens.length);

    // The same prompt as token ids, and as one of an array of strings.
    const byIds = await client.completions.create({ model: 'x', prompt: ref.prompt_tokens, max_tokens: 24, temperature: 0 });
    assert.equal(byIds.choices[0].text, ref.text);
    const [ref2] = generate(['-p', 'import numpy', '-n', '24', '--temp', '0']);
    const several = await client.completions.create({
      model: 'x',
      prompt: [PROMPT, 'import numpy'],
      max_tokens: 24,
      temperature: 0,
    });
    assert.deepEqual(
      several.choices.map((c) => [c.index, c.text]),
      [
        [0, ref.text],
        [1, ref2.text],
      ],
    );
  });

  test('OpenAI default max_tokens is 16', async () => {
    const r = await client.completions.create({ model: 'x', prompt: PROMPT, temperature: 0, ignore_eos: true });
    assert.equal(r.usage.completion_tokens, 16);
    assert.equal(r.choices[0].finish_reason, 'length');
  });

  test('streamed chunks concatenate to the non-streamed text, then usage', async () => {
    const full = await client.completions.create({ model: 'x', prompt: PROMPT, max_tokens: 40, temperature: 0 });
    const stream = await client.completions.create({
      model: 'x',
      prompt: PROMPT,
      max_tokens: 40,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let chunks = 0;
    let finish = null;
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.text;
        chunks += 1;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(text, full.choices[0].text);
    assert.ok(chunks > 5, `expected one chunk per token or so, got ${chunks}`);
    assert.equal(finish, full.choices[0].finish_reason);
    assert.equal(typeof usage.prompt_tokens_details.cached_tokens, 'number');
    assert.equal(usage.completion_tokens, full.usage.completion_tokens);
    assert.equal(usage.prompt_tokens, full.usage.prompt_tokens);
  });

  test('stop strings cut the text before them', async () => {
    const full = await client.completions.create({ model: 'x', prompt: PROMPT, max_tokens: 24, temperature: 0 });
    const text = full.choices[0].text;
    const stop = text.slice(6, 10);
    assert.ok(stop.length > 0);
    const r = await client.completions.create({ model: 'x', prompt: PROMPT, max_tokens: 24, temperature: 0, stop });
    assert.equal(r.choices[0].text, text.slice(0, text.indexOf(stop)));
    assert.equal(r.choices[0].finish_reason, 'stop');
  });

  test('seeded sampling is reproducible and equals `generate --seed`', async () => {
    const params = { model: 'x', prompt: PROMPT, max_tokens: 24, temperature: 1, top_p: 1, seed: 1234, ignore_eos: true };
    const a = await client.completions.create(params);
    const b = await client.completions.create(params);
    assert.equal(a.choices[0].text, b.choices[0].text);
    const [ref] = generate(['-p', PROMPT, '-n', '24', '--temp', '1', '--top-k', '0', '--top-p', '1', '--min-p', '0',
      '--seed', '1234', '--ignore-eos']);
    assert.equal(a.choices[0].text, ref.text);
    // llama-server's extensions reach the sampler: top_k 1 is greedy whatever the temperature.
    const [greedy] = generate(['-p', PROMPT, '-n', '24', '--temp', '0', '--ignore-eos']);
    const k1 = await client.completions.create({ ...params, top_k: 1, seed: 99 });
    assert.equal(k1.choices[0].text, greedy.text);
  });

  test('logprobs equal a log-softmax of `mambacpp logits`', async () => {
    const [ref] = generate(['-p', PROMPT, '-n', '8', '--temp', '0', '--ignore-eos']);
    const r = await client.completions.create({
      model: 'x',
      prompt: ref.prompt_tokens,
      max_tokens: 8,
      temperature: 0,
      logprobs: 5,
      ignore_eos: true,
    });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, 8);
    assert.equal(lp.tokens.join(''), r.choices[0].text);
    const rows = logits([...ref.prompt_tokens, ...ref.tokens]);
    let offset = 0;
    for (let j = 0; j < 8; ++j) {
      const ls = logSoftmax(rows[ref.prompt_tokens.length - 1 + j]);
      assert.ok(Math.abs(lp.token_logprobs[j] - ls[ref.tokens[j]]) < 1e-3, `token ${j}: ${lp.token_logprobs[j]} vs ${ls[ref.tokens[j]]}`);
      const top = Object.values(lp.top_logprobs[j]).sort((x, y) => y - x);
      const expected = [...ls].sort((x, y) => y - x).slice(0, top.length);
      assert.ok(top.length >= 4 && top.length <= 5, `top_logprobs ${j} has ${top.length} entries`);
      top.forEach((v, k) => assert.ok(Math.abs(v - expected[k]) < 1e-3, `token ${j} alternative ${k}: ${v} vs ${expected[k]}`));
      assert.equal(lp.text_offset[j], offset);
      offset += Buffer.byteLength(lp.tokens[j]);
    }
  });

  test('a follow-up prompt starts from the cached state and equals a fresh run', async () => {
    const [first] = generate(['-p', 'class Parser:', '-n', '16', '--temp', '0', '--ignore-eos']);
    const a = await client.completions.create({ model: 'x', prompt: first.prompt_tokens, max_tokens: 16, temperature: 0, ignore_eos: true });
    assert.equal(a.choices[0].text, first.text);
    const more = (await postJson(server.url, '/tokenize', { content: '\n    def run(self):' })).json.tokens;
    const followUp = [...first.prompt_tokens, ...first.tokens, ...more];
    const b = await client.completions.create({ model: 'x', prompt: followUp, max_tokens: 16, temperature: 0 });
    assert.ok(b.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(b.usage));
    const [fresh] = generate(['--tokens-file', writeScratch('follow_up.txt', followUp.join(' ')), '-n', '16', '--temp', '0',
      '--state-cache-mb', '0']);
    assert.equal(fresh.cached_prompt_tokens, 0);
    assert.equal(b.choices[0].text, fresh.text);
  });

  test('64 concurrent streams run at once and each gives its tokens alone', async () => {
    const prompts = Array.from({ length: 64 }, (_, i) => `def handler_${i}(request, `);
    const refs = generate(['--prompts-file', writeScratch('prompts.txt', prompts.join('\n') + '\n'), '--max-seqs', '1', '-n',
      '24', '--temp', '0', '--ignore-eos']);
    assert.equal(refs.length, 64);
    // generate blocked the event loop (15 s on a loaded 2-core machine), longer than the server keeps idle
    // connections (--keep-alive-timeout 10): let the client see the ones it closed before reusing them.
    await new Promise((r) => setTimeout(r, 100));
    const texts = await Promise.all(
      prompts.map(async (prompt) => {
        const stream = await client.completions.create({
          model: 'x', prompt, max_tokens: 24, temperature: 0, ignore_eos: true, stream: true,
        });
        let text = '';
        for await (const chunk of stream) for (const c of chunk.choices) text += c.text;
        return text;
      }),
    );
    texts.forEach((t, i) => assert.equal(t, refs[i].text, `stream ${i}`));
    // The engine's own peak (one step's rows): sampling /metrics from here misses short peaks on a loaded machine.
    const peak = (await metrics(server.url)).mambacpp_requests_running_peak;
    assert.ok(peak >= 32, `at most ${peak} requests ran at once`);
  });

  test('a client that disconnects mid-stream frees its slot', async () => {
    const before = await metrics(server.url);
    const stream = await client.completions.create({
      model: 'x', prompt: PROMPT, max_tokens: 100000, temperature: 0, ignore_eos: true, stream: true,
    });
    let chunks = 0;
    for await (const _ of stream) if (++chunks === 3) break;  // leaving the loop aborts the HTTP request
    await waitFor(async () => (await metrics(server.url)).mambacpp_requests_running === 0, 5000, 'the slot to be freed');
    const m = await metrics(server.url);
    assert.equal(m.mambacpp_requests_cancelled_total, before.mambacpp_requests_cancelled_total + 1);
    const steps = m.mambacpp_step_seconds_count;
    await new Promise((r) => setTimeout(r, 200));
    assert.equal((await metrics(server.url)).mambacpp_step_seconds_count, steps, 'the engine stopped stepping');
  });

  test('malformed requests get a 400 naming the field', async () => {
    const cases = [
      ['{"prompt": "x",', null, /not valid JSON/],
      ['[1, 2]', null, /expected a JSON object/],
      [{}, 'prompt', /missing/],
      [{ prompt: 5 }, 'prompt', /found an integer/],
      [{ prompt: [] }, 'prompt', /empty array/],
      [{ prompt: [1, 'a'] }, 'prompt', /token 1: expected an integer token id/],
      [{ prompt: [4096] }, 'prompt', /outside the vocabulary \[0, 4096\)/],
      [{ prompt: [-1] }, 'prompt', /outside the vocabulary/],
      [{ prompt: ['a', 7] }, 'prompt[1]', /expected a string or a non-empty array of token ids/],
      [{ prompt: 'x', max_tokens: -1 }, 'max_tokens', /expected an integer in \[0, /],
      [{ prompt: 'x', max_tokens: 1e15 }, 'max_tokens', /expected an integer/],
      [{ prompt: 'x', max_tokens: 2.5 }, 'max_tokens', /expected an integer/],
      [{ prompt: 'x', max_tokens: '16' }, 'max_tokens', /found a string/],
      [{ prompt: 'x', temperature: 3 }, 'temperature', /\[0, 2\]/],
      [{ prompt: 'x', temperature: 'hot' }, 'temperature', /found a string/],
      [{ prompt: 'x', top_p: 0 }, 'top_p', /\(0, 1\]/],
      [{ prompt: 'x', top_k: -2 }, 'top_k', /expected an integer/],
      [{ prompt: 'x', min_p: 2 }, 'min_p', /\[0, 1\]/],
      [{ prompt: 'x', repeat_penalty: 0 }, 'repeat_penalty', /\(0, 100\]/],
      [{ prompt: 'x', presence_penalty: 5 }, 'presence_penalty', /\[-2, 2\]/],
      [{ prompt: 'x', frequency_penalty: -3 }, 'frequency_penalty', /\[-2, 2\]/],
      [{ prompt: 'x', seed: 1.5 }, 'seed', /expected an integer/],
      [{ prompt: 'x', stop: 3 }, 'stop', /expected a string or an array of strings/],
      [{ prompt: 'x', stop: [''] }, 'stop', /empty/],
      [{ prompt: 'x', stream: 'yes' }, 'stream', /expected a boolean/],
      [{ prompt: 'x', stream_options: { include_usage: true } }, 'stream_options', /stream/],
      [{ prompt: 'x', logprobs: 21 }, 'logprobs', /\[0, 20\]/],
      [{ prompt: 'x', n: 3 }, 'n', /only 1 is supported/],
      [{ prompt: 'x', best_of: 2 }, 'best_of', /only 1/],
      [{ prompt: 'x', echo: true }, 'echo', /only false/],
      [{ prompt: 'x', suffix: 'end' }, 'suffix', /only null/],
      [{ prompt: 'x', logit_bias: { 5: 10 } }, 'logit_bias', /not implemented/],
      [{ prompt: 'x', model: 7 }, 'model', /expected a string/],
      [{ prompt: Array(70000).fill(5) }, 'prompt', /more than the limit of 65536/],
    ];
    for (const [body, param, message] of cases) {
      const r = await postJson(server.url, '/v1/completions', body);
      const what = typeof body === 'string' ? body : JSON.stringify(body).slice(0, 80);
      assert.equal(r.status, 400, `${what}: ${r.text}`);
      assert.equal(r.json.error.type, 'invalid_request_error', what);
      assert.equal(r.json.error.param, param, what);
      assert.match(r.json.error.message, message, what);
      assert.ok('code' in r.json.error, what);
    }
    // Neutral values of unimplemented parameters are accepted.
    const ok = await postJson(server.url, '/v1/completions', { prompt: 'x', max_tokens: 1, n: 1, best_of: 1, echo: false, logit_bias: {} });
    assert.equal(ok.status, 200, ok.text);
    // The OpenAI client raises BadRequestError with the server's message.
    await assert.rejects(client.completions.create({ model: 'x', prompt: 'x', n: 3 }), (e) => e.status === 400 && /'n'/.test(e.message));
  });

  test('routes: 404, 405, tokenize/detokenize, chat without a template', async () => {
    assert.equal((await fetch(`${server.url}/v1/nothing`)).status, 404);
    const wrong = await fetch(`${server.url}/v1/completions`);
    assert.equal(wrong.status, 405);
    assert.equal(wrong.headers.get('allow'), 'POST');
    assert.match((await wrong.json()).error.message, /use POST/);
    const tok = await postJson(server.url, '/tokenize', { content: PROMPT });
    const [ref] = generate(['-p', PROMPT, '-n', '0']);
    assert.deepEqual(tok.json.tokens, ref.prompt_tokens);
    const detok = await postJson(server.url, '/detokenize', { tokens: ref.prompt_tokens });
    assert.equal(detok.json.content, PROMPT);
    assert.equal((await postJson(server.url, '/detokenize', { tokens: [1e6] })).status, 400);
    const chat = await postJson(server.url, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(chat.status, 400);
    assert.match(chat.json.error.message, /no chat template/);
  });

  test('metrics in the Prometheus text format', async () => {
    const text = await (await fetch(`${server.url}/metrics`)).text();
    for (const name of ['requests_running', 'requests_running_peak', 'requests_queued', 'requests_total',
      'prompt_tokens_total', 'generated_tokens_total', 'cached_tokens_total', 'cache_bytes', 'step_seconds']) {
      assert.match(text, new RegExp(`# TYPE mambacpp_${name} (gauge|counter|summary)`), name);
    }
    const m = await metrics(server.url);
    assert.ok(m.mambacpp_requests_total > 64);
    assert.ok(m.mambacpp_generated_tokens_total > 64 * 24);
    assert.ok(m.mambacpp_cached_tokens_total > 0);
  });
});

describe('serve --api-key, --parallel 1 --max-queue 1, --chat-template chatml', () => {
  let server, client;
  const key = 'sk-test-key';
  const auth = { Authorization: `Bearer ${key}` };
  before(async () => {
    server = await startServer(['--api-key', key, '--parallel', '1', '--max-queue', '1', '--chat-template', 'chatml',
      '--max-body-mb', '1', '--shutdown-timeout', '0']);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: key, maxRetries: 0 });
  });
  after(async () => {
    if (server.proc.exitCode === null) server.proc.kill('SIGKILL');
  });

  test('a missing or wrong key gets 401; /health needs none', async () => {
    assert.equal((await fetch(`${server.url}/health`)).status, 200);
    const none = await postJson(server.url, '/v1/completions', { prompt: 'x' });
    assert.equal(none.status, 401);
    assert.equal(none.json.error.type, 'authentication_error');
    const wrong = await postJson(server.url, '/v1/completions', { prompt: 'x' }, { Authorization: 'Bearer nope' });
    assert.equal(wrong.status, 401);
    assert.equal(wrong.json.error.code, 'invalid_api_key');
    const bad = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'nope', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e.status === 401);
    assert.equal((await client.models.list()).data.length, 1);
  });

  test('a body over --max-body-mb gets 413', async () => {
    const r = await postJson(server.url, '/v1/completions', { prompt: 'x'.repeat(2 << 20) }, auth);
    assert.equal(r.status, 413);
    assert.match(r.json.error.message, /too large/);
  });

  test('answers stay bounded: /tokenize past --max-prompt tokens, a number where a string belongs', async () => {
    // 70000 tokens of ' a' (the default --max-prompt is 65536); with pieces the answer took hundreds of bytes a token.
    const long = await postJson(server.url, '/tokenize', { content: ' a'.repeat(70000), with_pieces: true }, auth);
    assert.equal(long.status, 400, long.text);
    assert.match(long.json.error.message, /encodes to 70000 tokens, more than the limit of 65536 .*--max-prompt/);
    const short = await postJson(server.url, '/tokenize', { content: ' a'.repeat(100), with_pieces: true }, auth);
    assert.equal(short.status, 200, short.text);
    assert.equal(short.json.tokens.length, 100);
    for (const body of [
      { messages: [{ role: 'user', content: [{ type: 1, text: 'a' }] }] },
      { messages: [{ role: 'user', content: 'a' }], response_format: { type: 2 } },
    ]) {
      const r = await postJson(server.url, '/v1/chat/completions', body, auth);
      assert.equal(r.status, 400, r.text);  // nlohmann's own type_error made it a 500
      assert.equal(r.json.error.type, 'invalid_request_error');
    }
  });

  test('chat completions with ChatML, plain and streamed', async () => {
    const messages = [
      { role: 'system', content: 'You write Python.' },
      { role: 'user', content: 'Parse the arguments.' },
    ];
    const prompt = '<|im_start|>system\nYou write Python.<|im_end|>\n<|im_start|>user\nParse the arguments.<|im_end|>\n<|im_start|>assistant\n';
    const [ref] = generate(['-p', prompt, '-n', '20', '--temp', '0', '--stop', '<|im_end|>']);
    const r = await client.chat.completions.create({ model: 'x', messages, max_tokens: 20, temperature: 0 });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(r.choices[0].message.content, ref.text);
    assert.equal(r.usage.prompt_tokens, ref.prompt_tokens.length);
    const stream = await client.chat.completions.create({ model: 'x', messages, max_tokens: 20, temperature: 0, stream: true });
    let text = '';
    let role = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      for (const c of chunk.choices) {
        if (c.delta.role) role = c.delta.role;
        text += c.delta.content ?? '';
      }
    }
    assert.equal(role, 'assistant');
    assert.equal(text, ref.text);
    const bad = await postJson(server.url, '/v1/chat/completions', { messages: [{ role: 'robot', content: 'x' }] }, auth);
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'messages[0].role');
  });

  test('a full queue gets 503 with Retry-After', async () => {
    const long = { model: 'x', prompt: PROMPT, max_tokens: 100000, ignore_eos: true, stream: true };
    const running = await client.completions.create(long);  // holds the one slot
    const it = running[Symbol.asyncIterator]();
    await it.next();
    const queued = await client.completions.create(long);  // waits in the one queue place
    await waitFor(async () => (await (await fetch(`${server.url}/metrics`, { headers: auth })).text()).includes('mambacpp_requests_queued 1'), 5000, 'a queued request');
    const full = await postJson(server.url, '/v1/completions', { prompt: 'x', max_tokens: 1 }, auth);
    assert.equal(full.status, 503, full.text);
    assert.equal(full.headers.get('retry-after'), '1');
    assert.equal(full.json.error.type, 'server_error');
    assert.match(full.json.error.message, /--max-queue/);
    running.controller.abort();
    queued.controller.abort();
  });

  test('SIGTERM with --shutdown-timeout 0 ends the streams in flight and exits 0 within 5 s', async () => {
    await waitFor(async () => {
      const text = await (await fetch(`${server.url}/metrics`, { headers: auth })).text();
      return text.includes('mambacpp_requests_running 0') && text.includes('mambacpp_requests_queued 0');
    }, 5000, 'an idle server');
    const stream = await client.completions.create({ model: 'x', prompt: PROMPT, max_tokens: 100000, ignore_eos: true, stream: true });
    const it = stream[Symbol.asyncIterator]();
    await it.next();
    const t0 = Date.now();
    server.proc.kill('SIGTERM');
    // The stream ends with an error event that the client raises.
    await assert.rejects(
      (async () => {
        for (let r = await it.next(); !r.done; r = await it.next());
      })(),
      (e) => /shutting down/.test(e.message),
    );
    const { code } = await server.exited;
    assert.equal(code, 0, server.stderr());
    assert.ok(Date.now() - t0 < 5000, `took ${Date.now() - t0} ms`);
  });
});

describe('serve --draft-model (the shipped model drafting for itself)', () => {
  let server;
  const CODE = 'def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(';
  before(async () => {
    server = await startServer(['--draft-model', new URL('../../models/default', import.meta.url).pathname]);
  });
  after(async () => {
    server.proc.kill('SIGTERM');
    await server.exited;
  });

  test('speculative requests give the greedy text of `generate --temp 0` and count their drafts', async () => {
    const [ref] = generate(['-p', CODE, '-n', '24', '--temp', '0', '--ignore-eos']);
    const body = { prompt: CODE, max_tokens: 24, temperature: 0, ignore_eos: true };
    const plain = await postJson(server.url, '/v1/completions', { ...body, draft_model: false });
    assert.equal(plain.json.choices[0].text, ref.text);
    assert.equal(plain.json.usage.draft_tokens, 0);
    // No draft field: the server's default (its draft model).
    for (const extra of [{}, { draft_model: true, draft_max: 3 }, { draft_ngram: 2 }]) {
      const r = await postJson(server.url, '/v1/completions', { ...body, ...extra });
      assert.equal(r.json.choices[0].text, ref.text, JSON.stringify(extra));
      assert.ok(r.json.usage.draft_tokens > 0, JSON.stringify(r.json.usage));
      assert.ok(r.json.usage.accepted_draft_tokens <= r.json.usage.draft_tokens);
      if (!extra.draft_ngram) assert.equal(r.json.usage.accepted_draft_tokens, r.json.usage.draft_tokens);
    }
    const m = await metrics(server.url);
    assert.ok(m.mambacpp_draft_tokens_total > 0);
    assert.ok(m.mambacpp_draft_acceptance_rate > 0 && m.mambacpp_draft_acceptance_rate <= 1);
    const both = await postJson(server.url, '/v1/completions', { ...body, draft_model: true, draft_ngram: 2 });
    assert.equal(both.status, 400);
    assert.equal(both.json.error.param, 'draft_model');
  });
});
