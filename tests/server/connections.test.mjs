// The server's connections (app/server/http_connections.h), over raw sockets so that the test controls every byte
// and every pause: keep-alive like common servers (reuse after seconds idle, no small request cap), slow clients cut
// off by the read timeout without starving a normal request (slowloris), and a clear 503 past --max-connections.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';

import { startServer } from './support.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A client connection that reads whole HTTP/1.1 responses (Content-Length bodies) and notes when the server closes.
class Connection {
  static open(url) {
    const { hostname, port } = new URL(url);
    return new Promise((resolve, reject) => {
      const c = new Connection(net.connect({ host: hostname, port: Number(port) }));
      c.socket.once('connect', () => resolve(c));
      c.socket.once('error', reject);
    });
  }

  constructor(socket) {
    this.socket = socket;
    this.buffer = Buffer.alloc(0);
    this.waiters = [];
    this.closedAt = null;
    this.closed = new Promise((resolve) => {
      socket.on('close', () => {
        this.closedAt = Date.now();
        resolve();
        this.wake();
      });
    });
    socket.on('error', () => {});  // a reset shows as 'close'
    socket.on('data', (d) => {
      this.buffer = Buffer.concat([this.buffer, d]);
      this.wake();
    });
  }

  wake() {
    for (const w of this.waiters.splice(0)) w();
  }

  async response(timeoutMs = 10000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const end = this.buffer.indexOf('\r\n\r\n');
      if (end >= 0) {
        const head = this.buffer.subarray(0, end).toString('latin1');
        const [statusLine, ...lines] = head.split('\r\n');
        const headers = {};
        for (const l of lines) headers[l.slice(0, l.indexOf(':')).toLowerCase()] = l.slice(l.indexOf(':') + 1).trim();
        const length = Number(headers['content-length'] ?? 0);
        if (this.buffer.length >= end + 4 + length) {
          const body = this.buffer.subarray(end + 4, end + 4 + length).toString('utf8');
          this.buffer = this.buffer.subarray(end + 4 + length);
          return { status: Number(statusLine.split(' ')[1]), headers, body };
        }
      }
      if (this.closedAt !== null) throw new Error(`connection closed before a whole response: '${this.buffer}'`);
      if (Date.now() > deadline) throw new Error(`no whole response in ${timeoutMs} ms: '${this.buffer}'`);
      await Promise.race([new Promise((r) => this.waiters.push(r)), sleep(Math.max(1, deadline - Date.now()))]);
    }
  }

  async request(method, path, body = null, extraHeaders = '') {
    const payload = body === null ? '' : JSON.stringify(body);
    this.socket.write(
      `${method} ${path} HTTP/1.1\r\nHost: test\r\n${extraHeaders}` +
        (body === null ? '' : `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(payload)}\r\n`) +
        `\r\n${payload}`,
    );
    return this.response();
  }
}

async function oneRequest(url, method, path, body = null) {
  const c = await Connection.open(url);
  try {
    return await c.request(method, path, body, 'Connection: close\r\n');
  } finally {
    c.socket.destroy();
  }
}

// A slowloris client: the start of a request head, then one more header byte every `everyMs`, never finishing.
async function trickle(url, everyMs) {
  const c = await Connection.open(url);
  c.socket.write('POST /v1/completions HTTP/1.1\r\nHost: test\r\n');
  c.firstByteAt = Date.now();
  c.timer = setInterval(() => {
    if (c.closedAt === null) c.socket.write('x');
  }, everyMs);
  c.closed.then(() => clearInterval(c.timer));
  return c;
}

describe('serve with the default connection settings', () => {
  let server;
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    server.proc.kill('SIGTERM');
    await server.exited;
  });

  test('a connection idle for 6 s is still open and serves the next request', async () => {
    const c = await Connection.open(server.url);
    assert.equal((await c.request('GET', '/health')).status, 200);
    await sleep(6000);  // past Python's, httpx's and most pools' reuse windows; the server's default is 10 s
    assert.equal(c.closedAt, null, 'the server closed an idle connection within 6 s');
    const r = await c.request('GET', '/health');
    assert.equal(r.status, 200);
    c.socket.destroy();
  });

  test('one connection serves 100 requests without closing', async () => {
    const c = await Connection.open(server.url);
    for (let i = 0; i < 100; ++i) {
      const r = await c.request('POST', '/tokenize', { content: `request ${i}` });
      assert.equal(r.status, 200, r.body);
      assert.notEqual(r.headers.connection, 'close', `request ${i} was answered with Connection: close`);
    }
    assert.equal(c.closedAt, null);
    c.socket.destroy();
  });

  test('an answer given before the body was read (405) says Connection: close and closes; the next one is clean', async () => {
    const c = await Connection.open(server.url);
    const r = await c.request('POST', '/v1/models', { prompt: 'x'.repeat(10000) });
    assert.equal(r.status, 405);
    assert.equal(r.headers.connection, 'close');
    await Promise.race([c.closed, sleep(3000)]);
    assert.notEqual(c.closedAt, null, 'the connection stayed open with an unread body on it');
    // On a connection whose body was read, an error answer keeps the connection.
    const k = await Connection.open(server.url);
    const bad = await k.request('POST', '/tokenize', { content: 7 });
    assert.equal(bad.status, 400);
    assert.equal((await k.request('GET', '/health')).status, 200);
    k.socket.destroy();
  });

  test('pipelined requests on one connection are all answered', async () => {
    const c = await Connection.open(server.url);
    c.socket.write('GET /health HTTP/1.1\r\nHost: test\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: test\r\n\r\n');
    assert.equal((await c.response()).status, 200);
    const models = await c.response();
    assert.equal(models.status, 200);
    assert.equal(JSON.parse(models.body).object, 'list');
    c.socket.destroy();
  });
});

describe('serve --keep-alive-timeout 1 --read-timeout 2 --max-connections 64', () => {
  let server;
  before(async () => {
    server = await startServer(['--keep-alive-timeout', '1', '--read-timeout', '2', '--max-connections', '64']);
  });
  after(async () => {
    server.proc.kill('SIGTERM');
    await server.exited;
  });

  test('a connection that sends nothing is closed after the keep-alive timeout', async () => {
    const c = await Connection.open(server.url);
    const opened = Date.now();
    await Promise.race([c.closed, sleep(5000)]);
    assert.notEqual(c.closedAt, null, 'an idle connection was still open after 5 s');
    assert.ok(c.closedAt - opened >= 900, `closed after ${c.closedAt - opened} ms, before the keep-alive timeout`);
  });

  test('slowloris: 48 connections trickling their headers do not starve a normal request, and are cut off', async () => {
    const slow = await Promise.all(Array.from({ length: 48 }, () => trickle(server.url, 100)));
    await sleep(500);
    const t0 = Date.now();
    const r = await oneRequest(server.url, 'POST', '/v1/completions', { prompt: 'def parse_args(', max_tokens: 4 });
    assert.equal(r.status, 200, r.body);
    assert.equal(JSON.parse(r.body).usage.completion_tokens, 4);
    assert.ok(Date.now() - t0 < 1500, `a normal request took ${Date.now() - t0} ms beside the slow clients`);
    // Each keeps sending a byte every 100 ms; the read timeout (2 s from its first byte) ends it all the same.
    await Promise.race([Promise.all(slow.map((c) => c.closed)), sleep(6000)]);
    for (const c of slow) {
      assert.notEqual(c.closedAt, null, 'a trickling connection was still open 6 s after its first byte');
      const held = c.closedAt - c.firstByteAt;
      assert.ok(held >= 1500 && held < 5000, `a trickling connection was closed after ${held} ms (read timeout 2 s)`);
    }
  });
});

describe('serve --max-connections 4 --read-timeout 2', () => {
  let server;
  before(async () => {
    server = await startServer(['--max-connections', '4', '--read-timeout', '2']);
  });
  after(async () => {
    server.proc.kill('SIGTERM');
    await server.exited;
  });

  test('past the limit a connection gets a clear 503 at once; once the slow ones are cut off, 200', async () => {
    const slow = await Promise.all(Array.from({ length: 4 }, () => trickle(server.url, 100)));
    await sleep(200);
    const t0 = Date.now();
    const refused = await oneRequest(server.url, 'GET', '/health');
    assert.ok(Date.now() - t0 < 1000, `the refusal took ${Date.now() - t0} ms`);
    assert.equal(refused.status, 503);
    assert.equal(refused.headers['retry-after'], '1');
    const error = JSON.parse(refused.body).error;
    assert.equal(error.type, 'server_error');
    assert.match(error.message, /4 connections open, its limit \(--max-connections\)/);
    await Promise.race([Promise.all(slow.map((c) => c.closed)), sleep(6000)]);
    for (const c of slow) assert.notEqual(c.closedAt, null, 'a slow connection outlived the read timeout');
    const r = await oneRequest(server.url, 'GET', '/health');
    assert.equal(r.status, 200, r.body);
  });

  test('a burst of 32 clients on 4 connections: each is answered 200 or 503, never left hanging', async () => {
    const results = await Promise.all(
      Array.from({ length: 32 }, () => oneRequest(server.url, 'POST', '/tokenize', { content: 'burst' })),
    );
    for (const r of results) assert.ok(r.status === 200 || r.status === 503, `status ${r.status}`);
    assert.ok(results.some((r) => r.status === 200));
  });
});
