// `mambacpp serve` on SIGTERM: it stops accepting connections at once, lets the requests in flight finish whole
// (streamed and not), exits 0, and what they cached is on disk for the next process; past --shutdown-timeout the
// requests left are cancelled and the process still exits 0.
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { generate, postJson, startServer } from './support.mjs';

const PROMPT = 'def shutdown_handler(signum, ';

// A streamed completion: resolves with its data events once the stream ends; `onFirst` runs at the first event.
async function stream(url, body, onFirst) {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
  });
  assert.equal(res.status, 200);
  const decoder = new TextDecoder();
  let text = '';
  let first = true;
  for await (const chunk of res.body) {
    text += decoder.decode(chunk, { stream: true });
    if (first && text.includes('data: ')) {
      first = false;
      onFirst?.();
    }
  }
  return text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
}

function connects(url) {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    const s = net.connect({ host: hostname, port: Number(port) });
    s.on('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.on('error', () => resolve(false));
  });
}

test('SIGTERM: requests in flight complete whole, new connections are refused, exit 0, the cache is on disk', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'mambacpp-shutdown-'));
  const args = ['--state-cache-dir', dir, '--state-cache-disk-mb', '64', '--shutdown-timeout', '60'];
  const server = await startServer(args);
  const maxTokens = 300;
  let signalled = false;
  let refused = null;
  const sigterm = () => {
    if (signalled) return;
    signalled = true;
    server.proc.kill('SIGTERM');
    // The listening socket closes at once (a load balancer's connect fails and it picks another replica).
    refused = new Promise((r) => setTimeout(r, 200)).then(async () => !(await connects(server.url)));
  };
  // Two requests generating when the signal comes: one streamed (the signal at its first event), one not.
  const plain = postJson(server.url, '/v1/completions', { prompt: PROMPT, max_tokens: maxTokens, temperature: 0,
                                                          ignore_eos: true });
  const events = await stream(server.url, { prompt: 'class Shutdown:\n    def ', max_tokens: maxTokens,
                                            ignore_eos: true }, sigterm);
  assert.ok(signalled, 'the stream sent no event');
  assert.equal(await refused, true, 'a new connection was accepted while draining');
  assert.equal(events.at(-1), '[DONE]');
  const usage = JSON.parse(events.at(-2)).usage;
  assert.equal(usage.completion_tokens, maxTokens, 'the stream was cut short');
  const r = await plain;
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.usage.completion_tokens, maxTokens);
  assert.equal(r.json.choices[0].finish_reason, 'length');
  const { code, signal } = await server.exited;
  assert.equal(signal, null);
  assert.equal(code, 0, server.stderr());
  assert.match(server.stderr(), /serve: stopped \(0 requests cancelled\)/);

  // The conversation of the plain request goes on in the next process, from the disk tier.
  const turn = PROMPT + r.json.choices[0].text + '\n';
  const [ref] = generate(['-p', turn, '-n', '8', '--temp', '0']);
  const next = await startServer(args);
  const second = await postJson(next.url, '/v1/completions', { prompt: turn, max_tokens: 8, temperature: 0 });
  assert.equal(second.status, 200, second.text);
  assert.ok(second.json.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(second.json.usage));
  assert.equal(second.json.choices[0].text, ref.text);
  next.proc.kill('SIGKILL');
  await next.exited;
});

test('SIGTERM past --shutdown-timeout: the requests left are cancelled and the process exits 0', async () => {
  const server = await startServer(['--shutdown-timeout', '1']);
  const started = Date.now();
  let signalledAt = 0;
  const events = await stream(server.url, { prompt: PROMPT, max_tokens: 1000000, ignore_eos: true }, () => {
    signalledAt = Date.now();
    server.proc.kill('SIGTERM');
  });
  const { code } = await server.exited;
  assert.equal(code, 0, server.stderr());
  assert.ok(signalledAt > started);
  // The grace (1 s) and the time for cancelled streams to send their end (at most 2 s), not the 10^6 tokens.
  assert.ok(Date.now() - signalledAt < 10000, `exited ${Date.now() - signalledAt} ms after SIGTERM`);
  assert.match(server.stderr(), /serve: stopped \(1 requests cancelled\)/);
  assert.equal(events.at(-1), '[DONE]', 'a cancelled stream still ends properly');
});

test('every answer names its replica: --replica-id, or host:port by default', async () => {
  const named = await startServer(['--replica-id', 'replica-a']);
  const h = await fetch(`${named.url}/health`);
  assert.equal(h.headers.get('x-mambacpp-replica'), 'replica-a');
  const e = await postJson(named.url, '/v1/completions', { prompt: 'x', max_tokens: -1 });
  assert.equal(e.status, 400);
  assert.equal(e.headers.get('x-mambacpp-replica'), 'replica-a', 'errors carry it too');
  named.proc.kill('SIGTERM');
  assert.equal((await named.exited).code, 0);

  const unnamed = await startServer();
  const port = new URL(unnamed.url).port;
  const id = (await fetch(`${unnamed.url}/health`)).headers.get('x-mambacpp-replica');
  assert.match(id, new RegExp(`^[^:]+:${port}$`));
  unnamed.proc.kill('SIGTERM');
  assert.equal((await unnamed.exited).code, 0);
});
