// nginx in front of `mambacpp serve` replicas: the config docs/deploy.md shows, and an unprivileged nginx started
// with it under a temporary prefix. `node nginx.mjs` prints the config for two replicas on ports 8081 and 8082.
import { spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

// Debian installs nginx in /usr/sbin, which is not on an unprivileged user's PATH.
export const nginxBinary =
  process.env.MAMBACPP_NGINX ?? ['/usr/sbin/nginx', '/usr/local/sbin/nginx'].find((p) => existsSync(p)) ?? 'nginx';

// The http{} part: what a deployment would put in /etc/nginx/conf.d/ (with its own ports and paths).
export function upstreamConfig(replicas, listen) {
  return `upstream mambacpp {
    # A conversation's turns go to the replica that holds its state. nginx does not parse request bodies, so the key
    # is a header the client sets (the OpenAI "user" field is invisible here); requests without it hash to one replica.
    hash $http_x_conversation_id consistent;
${replicas.map((r) => `    server ${r} max_fails=1 fail_timeout=10s;`).join('\n')}
    keepalive 32;
    # Idle connections to a replica close before the replica's own --keep-alive-timeout (10 s) closes them.
    keepalive_timeout 5s;
}

server {
    listen ${listen};
    location / {
        proxy_pass http://mambacpp;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        # Tokens reach the client as they are generated; the request body stays buffered, so it can be resent.
        proxy_buffering off;
        proxy_read_timeout 600s;
        # A replica that refuses the connection, resets it before answering, or answers 502/503 (loading, full
        # queue, shutting down) is marked failed for fail_timeout and the request goes to the next one. POSTs are
        # retried too (non_idempotent): a completion has no side effect beyond the replica's cache. nginx cannot
        # retry once the response head has been passed to the client: a stream cut by a dying replica stays cut.
        proxy_next_upstream error timeout http_502 http_503 non_idempotent;
        # As many tries as replicas: with one stopped for a deploy and another dead, a key still finds the third.
        proxy_next_upstream_tries ${replicas.length};
        add_header X-Upstream $upstream_addr always;
    }
}
`;
}

export function nginxConfig(prefix, replicas, listen) {
  const indent = (text) => text.replace(/^(?=.)/gm, '    ');
  return `daemon off;
worker_processes 1;
pid ${prefix}/nginx.pid;
error_log ${prefix}/error.log warn;
events { worker_connections 1024; }
http {
    access_log ${prefix}/access.log;
    client_body_temp_path ${prefix}/client_body;
    proxy_temp_path ${prefix}/proxy;
    fastcgi_temp_path ${prefix}/fastcgi;
    uwsgi_temp_path ${prefix}/uwsgi;
    scgi_temp_path ${prefix}/scgi;
${indent(upstreamConfig(replicas, listen))}}
`;
}

export async function freePort() {
  const srv = net.createServer();
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address();
  await new Promise((r) => srv.close(r));
  return port;
}

// Starts nginx in front of `replicas` ("127.0.0.1:PORT") and resolves once it accepts connections.
export async function startNginx(replicas) {
  const prefix = mkdtempSync(path.join(tmpdir(), 'mambacpp-nginx-'));
  // Run as root (CI), nginx's workers drop to nobody: they must reach the temp dirs under the prefix.
  chmodSync(prefix, 0o755);
  const port = await freePort();
  const conf = path.join(prefix, 'nginx.conf');
  writeFileSync(conf, nginxConfig(prefix, replicas, `127.0.0.1:${port}`));
  // -e: the error log before the config is read (the default /var/log/nginx is not writable unprivileged).
  const proc = spawn(nginxBinary, ['-p', prefix, '-c', conf, '-e', `${prefix}/error.log`], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  proc.stdout.on('data', (d) => (output += d));
  proc.stderr.on('data', (d) => (output += d));
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  let gone = null;
  exited.then((e) => (gone = e));
  const errorLog = () => (existsSync(`${prefix}/error.log`) ? readFileSync(`${prefix}/error.log`, 'utf8') : '');
  const deadline = Date.now() + 10000;
  for (;;) {
    if (gone) throw new Error(`nginx exited (${JSON.stringify(gone)}): ${output}${errorLog()}`);
    const ok = await new Promise((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => (s.destroy(), resolve(true)));
      s.on('error', () => resolve(false));
    });
    if (ok) break;
    if (Date.now() > deadline) throw new Error(`nginx did not listen in 10 s: ${output}${errorLog()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return { proc, exited, url: `http://127.0.0.1:${port}`, prefix, errorLog };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  process.stdout.write(upstreamConfig(['127.0.0.1:8081', '127.0.0.1:8082'], '8080'));
}
