// Helpers of the server tests: start `mambacpp serve` on a free loopback port, run the CLI for reference outputs,
// read /metrics, read .npy files.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const binary = process.env.MAMBACPP_BINARY ?? path.resolve(here, '../../build/mambacpp');
export const scratch = mkdtempSync(path.join(tmpdir(), 'mambacpp-server-test-'));

// Starts the server with `args` (on CPU, port 0) and resolves once it prints its URL.
export function startServer(args = []) {
  const proc = spawn(binary, ['serve', '--device', 'cpu', '--host', '127.0.0.1', '--port', '0', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  proc.stderr.on('data', (d) => (stderr += d));
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  return new Promise((resolve, reject) => {
    let stdout = '';
    const timer = setTimeout(() => reject(new Error(`server did not start in 30 s; stderr: ${stderr}`)), 30000);
    proc.stdout.on('data', (d) => {
      stdout += d;
      const m = stdout.match(/http:\/\/127\.0\.0\.1:(\d+)\/v1 ready/);
      if (!m) return;
      clearTimeout(timer);
      const url = `http://127.0.0.1:${m[1]}`;
      resolve({ proc, url, exited, stderr: () => stderr });
    });
    exited.then(({ code }) => reject(new Error(`server exited with ${code} before it was ready: ${stderr}`)));
  });
}

// `mambacpp generate ... --json`: one JSON object per prompt.
export function generate(args) {
  const out = execFileSync(binary, ['generate', '--device', 'cpu', '--json', ...args], { encoding: 'utf8' });
  return out.trim().split('\n').map((line) => JSON.parse(line));
}

export function writeScratch(name, text) {
  const file = path.join(scratch, name);
  writeFileSync(file, text);
  return file;
}

// `mambacpp logits` of `tokens`: Float32Array rows, one per position.
export function logits(tokens) {
  const tokensFile = writeScratch('logits_tokens.txt', tokens.join(' '));
  const out = path.join(scratch, 'logits.npy');
  execFileSync(binary, ['logits', '--device', 'cpu', '--tokens-file', tokensFile, '-o', out]);
  const buf = readFileSync(out);
  const headerLen = buf.readUInt16LE(8);
  const header = buf.subarray(10, 10 + headerLen).toString('latin1');
  const shape = header.match(/'shape': \((\d+), (\d+)\)/).slice(1).map(Number);
  if (!header.includes("'<f4'")) throw new Error(`unexpected npy dtype: ${header}`);
  const data = new Float32Array(buf.buffer.slice(buf.byteOffset + 10 + headerLen, buf.byteOffset + buf.length));
  return Array.from({ length: shape[0] }, (_, i) => data.subarray(i * shape[1], (i + 1) * shape[1]));
}

export function logSoftmax(row) {
  let max = -Infinity;
  for (const x of row) max = Math.max(max, x);
  let sum = 0;
  for (const x of row) sum += Math.exp(x - max);
  const lse = max + Math.log(sum);
  return Array.from(row, (x) => x - lse);
}

// /metrics as {name: value}.
export async function metrics(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    const m = line.match(/^(mambacpp_\w+) (\S+)$/);
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}

export async function waitFor(check, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
}

export async function postJson(url, route, body, headers = {}) {
  const res = await fetch(`${url}${route}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: res.status, headers: res.headers, text, json };
}
