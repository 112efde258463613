// The prefix cache's disk tier (--state-cache-dir): a conversation's state written by one server process is served
// by the next one after a kill -9 (cached_tokens > 0, the same output as a fresh run), and a damaged or foreign file
// in the directory is skipped with a warning and deleted, never served.
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { generate, postJson, startServer } from './support.mjs';

const PROMPT = 'def parse_args(';

async function complete(url, prompt, maxTokens) {
  const r = await postJson(url, '/v1/completions', { prompt, max_tokens: maxTokens, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

async function kill9(server) {
  server.proc.kill('SIGKILL');
  await server.exited;
}

test('a restart after kill -9 serves the previous conversation from the disk tier, with the same output', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'mambacpp-disk-cache-'));
  const args = ['--state-cache-dir', dir, '--state-cache-disk-mb', '64'];
  let server = await startServer(args);
  const first = await complete(server.url, PROMPT, 16);
  const files = readdirSync(dir).filter((f) => f.endsWith('.state'));
  assert.ok(files.length >= 1, `no state file in ${dir}: ${readdirSync(dir)}`);
  await kill9(server);

  // The next turn continues the prompt and the answer; a fresh run of it is the reference.
  const turn = PROMPT + first.choices[0].text + '\n    parser = ';
  const [ref] = generate(['-p', turn, '-n', '12', '--temp', '0']);
  server = await startServer(args);
  const second = await complete(server.url, turn, 12);
  assert.ok(second.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(second.usage));
  assert.equal(second.choices[0].text, ref.text);
  await kill9(server);
});

test('kill -9 under load: the restart serves what was cached before, and nothing half-written is left or served', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'mambacpp-disk-cache-'));
  const args = ['--state-cache-dir', dir, '--state-cache-disk-mb', '256'];
  let server = await startServer(args);
  const first = await complete(server.url, PROMPT, 16);
  // 16 requests generating (each caches states as it goes), killed in the middle.
  const load = Array.from({ length: 16 }, (_, i) =>
    postJson(server.url, '/v1/completions', { prompt: `def handler_${i}(request, `, max_tokens: 4000, ignore_eos: true })
      .catch(() => null),
  );
  await new Promise((r) => setTimeout(r, 1500));
  await kill9(server);
  await Promise.all(load);

  const turn = PROMPT + first.choices[0].text + '\n    return ';
  const [ref] = generate(['-p', turn, '-n', '12', '--temp', '0']);
  server = await startServer(args);
  assert.doesNotMatch(server.stderr(), /skipping/, 'a file written before the kill was refused');
  const left = readdirSync(dir).filter((f) => !/^[0-9a-f]{16}-[0-9a-f]{16}\.state$/.test(f));
  assert.deepEqual(left, [], 'leftovers of the killed process are still in the directory');
  const second = await complete(server.url, turn, 12);
  assert.ok(second.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(second.usage));
  assert.equal(second.choices[0].text, ref.text);
  await kill9(server);
});

test('a damaged file and a foreign file in the directory are skipped with a warning and deleted', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'mambacpp-disk-cache-'));
  const args = ['--state-cache-dir', dir, '--state-cache-disk-mb', '64'];
  let server = await startServer(args);
  const first = await complete(server.url, PROMPT, 8);
  await kill9(server);
  const files = readdirSync(dir).filter((f) => f.endsWith('.state'));
  assert.ok(files.length >= 1);
  for (const f of files) {  // one flipped byte in the middle of the state data
    const bytes = readFileSync(path.join(dir, f));
    bytes[bytes.length >> 1] ^= 0x40;
    writeFileSync(path.join(dir, f), bytes);
  }
  // A file named like a cache file whose bytes are not a state file (its checksum matches its name: 0x0 bytes -> FNV
  // offset basis), so that only the state check can refuse it.
  writeFileSync(path.join(dir, '0000000000000001-cbf29ce484222325.state'), '');
  server = await startServer(args);
  for (const f of files) assert.ok(!readdirSync(dir).includes(f), `the damaged file ${f} was kept`);
  assert.ok(!readdirSync(dir).includes('0000000000000001-cbf29ce484222325.state'), 'the foreign file was kept');
  assert.match(server.stderr(), /prefix cache: skipping .*checksum/);
  assert.match(server.stderr(), /prefix cache: skipping .*0000000000000001-cbf29ce484222325\.state/);
  const turn = PROMPT + first.choices[0].text + '\n';
  const [ref] = generate(['-p', turn, '-n', '8', '--temp', '0']);
  const second = await complete(server.url, turn, 8);
  assert.equal(second.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(second.choices[0].text, ref.text);
  await kill9(server);
});
