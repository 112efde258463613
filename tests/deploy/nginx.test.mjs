// Three `mambacpp serve` replicas behind nginx (tests/deploy/nginx.mjs, the config docs/deploy.md shows), each named
// with --replica-id and answering with its name in X-Mambacpp-Replica: a conversation's turns reach the replica
// that holds its state (cached_tokens > 0 on the next turn); a replica stopped with SIGTERM under load (a rolling
// deploy) finishes what it was generating while nginx sends the new requests to the others, nothing resent by the
// client; and a replica killed with SIGKILL under 16 concurrent requests loses none of them: nginx resends what had
// not started answering to another replica, the client resends once a stream that was cut, and the survivor serves
// every conversation.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { metrics, startServer, waitFor } from '../server/support.mjs';
import { startNginx } from './nginx.mjs';

let replicas = [];
let nginx = null;

before(async () => {
  replicas = await Promise.all(
    [0, 1, 2].map((i) => startServer(['--parallel', '16', '--replica-id', `replica-${i}`, '--shutdown-timeout', '60'])),
  );
  nginx = await startNginx(replicas.map((r) => r.url.replace('http://', '')));
});

after(async () => {
  for (const r of replicas) if (r.proc.exitCode === null && r.proc.signalCode === null) r.proc.kill('SIGKILL');
  if (nginx) {
    nginx.proc.kill('SIGQUIT');
    await nginx.exited;
  }
});

const replicaOf = (upstream) => replicas.findIndex((r) => r.url === `http://${upstream}`);

// The replica that answered, by its own header; nginx's X-Upstream (the last address it tried) must agree.
function answeredBy(res) {
  const name = res.headers.get('x-mambacpp-replica');
  const m = /^replica-(\d)$/.exec(name ?? '');
  assert.ok(m, `no replica name in the answer: ${name}`);
  const upstream = replicaOf(res.headers.get('x-upstream').split(', ').at(-1));
  assert.equal(Number(m[1]), upstream, `${name} answered, nginx says ${res.headers.get('x-upstream')}`);
  return upstream;
}

async function complete(key, body) {
  const res = await fetch(`${nginx.url}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-Conversation-Id': key },
    body: JSON.stringify({ temperature: 0, ...body }),
  });
  const text = await res.text();
  assert.equal(res.status, 200, `${key}: ${text}`);
  // X-Upstream lists every replica nginx tried, the one that answered last.
  const tried = res.headers.get('x-upstream').split(', ');
  return { json: JSON.parse(text), tried, replica: answeredBy(res) };
}

// A streamed completion; `complete: false` when the stream ended without its [DONE] (the replica died under it).
async function stream(key, body) {
  try {
    const res = await fetch(`${nginx.url}/v1/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'X-Conversation-Id': key },
      body: JSON.stringify({ temperature: 0, stream: true, ...body }),
    });
    const raw = await res.text();
    if (res.status !== 200) return { complete: false, status: res.status, text: raw };
    const events = raw.split('\n\n').filter((e) => e.startsWith('data: '));
    const done = events.at(-1) === 'data: [DONE]';
    const chunks = events.filter((e) => e !== 'data: [DONE]').map((e) => JSON.parse(e.slice(6)));
    const text = chunks.map((c) => c.choices[0]?.text ?? '').join('');
    const usage = chunks.findLast((c) => c.usage)?.usage;
    return { complete: done, status: 200, text, usage, replica: answeredBy(res) };
  } catch (e) {
    return { complete: false, error: String(e) };
  }
}

// Enough keys that both replicas get some whatever their ports (the hash ring is built from "127.0.0.1:PORT").
const KEYS = Array.from({ length: 20 }, (_, i) => `conversation-${i}`);
const prompt = (i) => `def handler_${i}(request, `;

test('affinity: the next turn of a conversation reaches the same replica and is served from its cache', async () => {
  const first = await Promise.all(KEYS.map((k, i) => complete(k, { prompt: prompt(i), max_tokens: 8 })));
  const used = new Set(first.map((f) => f.replica));
  assert.ok(used.size >= 2, 'the keys should spread over the replicas');
  const second = await Promise.all(
    KEYS.map((k, i) => complete(k, { prompt: prompt(i) + first[i].json.choices[0].text + '\n    ', max_tokens: 8 })),
  );
  for (let i = 0; i < KEYS.length; ++i) {
    assert.equal(second[i].replica, first[i].replica, `${KEYS[i]} moved from replica ${first[i].replica}`);
    assert.ok(second[i].json.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(second[i].json.usage));
  }
});

test('SIGTERM of a replica under load: its requests in flight finish whole, the new ones go to the others', async () => {
  const draining = 2;
  // Streams that are generating on the draining replica when the signal comes: keys that hash to it.
  const keys = [];
  for (let j = 0; keys.length < 4 && j < 200; ++j) {
    const r = await complete(`drain-${j}`, { prompt: 'x', max_tokens: 1 });
    if (r.replica === draining) keys.push(`drain-${j}`);
  }
  assert.equal(keys.length, 4, 'no key hashes to the replica to drain');
  const body = { prompt: 'class Draining:\n    def ', max_tokens: 300, ignore_eos: true,
                 stream_options: { include_usage: true } };
  const inFlight = keys.map((k) => stream(k, body));
  await waitFor(async () => (await metrics(replicas[draining].url)).mambacpp_requests_running >= 4, 20000,
    'the streams generating on the replica to drain');
  replicas[draining].proc.kill('SIGTERM');
  // Its listening socket closes at once: the same conversations' next requests go to another replica meanwhile.
  await new Promise((r) => setTimeout(r, 300));
  const meanwhile = await Promise.all(keys.map((k) => complete(k, { prompt: 'y', max_tokens: 4 })));
  for (const m of meanwhile) assert.notEqual(m.replica, draining, JSON.stringify(m.tried));
  for (const r of await Promise.all(inFlight)) {
    assert.ok(r.complete && r.usage?.completion_tokens === 300, `a stream in flight was cut: ${JSON.stringify(r)}`);
    assert.equal(r.replica, draining);
  }
  const { code } = await replicas[draining].exited;
  assert.equal(code, 0, replicas[draining].stderr());
  assert.match(replicas[draining].stderr(), /serve: stopped \(0 requests cancelled\)/);
});

test('SIGKILL of a replica under 16 concurrent requests: every request completes, the survivor serves all', async () => {
  // The replica each key lives on (the affinity test's first turn sent them; the hash does not change).
  const home = (await Promise.all(KEYS.map((k, i) => complete(k, { prompt: prompt(i), max_tokens: 1 })))).map(
    (r) => r.replica,
  );
  const victim = 0;
  const survivor = 1;
  const before = await metrics(replicas[survivor].url);
  // 16 requests, long enough to be generating when the kill comes; half streamed, half not.
  const load = Array.from({ length: 16 }, (_, j) => {
    const key = `load-${j}`;
    const body = { prompt: `class Worker${j}:\n    def `, max_tokens: 400, ignore_eos: true };
    if (j % 2 === 0) {
      return complete(key, body).then(
        (r) => ({ key, kind: 'plain', ok: true, replica: r.replica, tried: r.tried }),
        (e) => ({ key, kind: 'plain', ok: false, error: e.message, tried: [] }),
      );
    }
    return stream(key, body).then(async (r) => {
      if (r.complete) return { key, kind: 'stream', ok: true, replica: r.replica };
      // The stream was cut after its head had reached the client: nginx cannot resend it; the client does, once.
      const again = await stream(key, body);
      return { key, kind: 'stream', ok: again.complete, retried: true, replica: again.replica, first: r };
    });
  });
  await waitFor(async () => (await metrics(replicas[victim].url)).mambacpp_requests_running >= 2, 20000,
    'requests generating on the victim');
  replicas[victim].proc.kill('SIGKILL');
  await replicas[victim].exited;
  const results = await Promise.all(load);
  for (const r of results) assert.ok(r.ok, `lost: ${JSON.stringify(r)}`);
  const retriedByNginx = results.filter((r) => r.kind === 'plain' && r.tried.length > 1);
  const retriedByClient = results.filter((r) => r.retried);
  console.log(`nginx resent ${retriedByNginx.length} plain request(s), the client ${retriedByClient.length} stream(s)`);
  // At least one request was on the victim when it died, and it was completed elsewhere.
  assert.ok(retriedByNginx.length + retriedByClient.length >= 1, JSON.stringify(results));
  for (const r of [...retriedByNginx, ...retriedByClient]) assert.equal(r.replica, survivor, JSON.stringify(r));
  const after = await metrics(replicas[survivor].url);
  assert.ok(after.mambacpp_requests_total - before.mambacpp_requests_total >= 16 - 8, 'the survivor took the load');

  // Every conversation goes on, the victim's ones on the survivor (a fresh prefill there: its cache lived in the
  // dead process), then from the survivor's cache.
  const turns = await Promise.all(KEYS.map((k, i) => complete(k, { prompt: prompt(i) + 'x', max_tokens: 4 })));
  for (let i = 0; i < KEYS.length; ++i) assert.equal(turns[i].replica, survivor, KEYS[i]);
  const moved = KEYS.map((_, i) => i).filter((i) => home[i] === victim);
  assert.ok(moved.length > 0);
  const next = await Promise.all(
    moved.map((i) => complete(KEYS[i], { prompt: prompt(i) + 'x' + turns[i].json.choices[0].text + ' ', max_tokens: 4 })),
  );
  for (const n of next) {
    assert.equal(n.replica, survivor);
    assert.ok(n.json.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(n.json.usage));
  }
});
