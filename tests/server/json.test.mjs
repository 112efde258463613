// Structured output through the OpenAI client: response_format json_object and json_schema on chat and text
// completions, llama-server's `grammar` field, and 400s naming what is not supported. The shipped model is tiny and
// untrained for JSON: sampled hot, every answer still parses and validates, because tokens the grammar rejects are
// masked before sampling.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';

import { postJson, startServer } from './support.mjs';

// The JSON-schema validation the schemas below need (type, properties, required, additionalProperties false,
// items, maxItems, maxLength, enum).
function validate(v, s, where = '$') {
  if (s.enum) return assert.ok(s.enum.some((e) => JSON.stringify(e) === JSON.stringify(v)), `${where}: ${JSON.stringify(v)} not in enum`);
  switch (s.type) {
    case 'string':
      assert.equal(typeof v, 'string', where);
      if (s.maxLength !== undefined) assert.ok([...v].length <= s.maxLength, `${where}: longer than ${s.maxLength}`);
      return;
    case 'integer': return assert.ok(Number.isInteger(v), `${where}: ${v} is not an integer`);
    case 'boolean': return assert.equal(typeof v, 'boolean', where);
    case 'array':
      assert.ok(Array.isArray(v), where);
      if (s.maxItems !== undefined) assert.ok(v.length <= s.maxItems, `${where}: more than ${s.maxItems} items`);
      return v.forEach((x, i) => validate(x, s.items, `${where}[${i}]`));
    case 'object':
      assert.ok(v !== null && typeof v === 'object' && !Array.isArray(v), `${where}: not an object`);
      for (const k of s.required ?? []) assert.ok(k in v, `${where}: '${k}' is required`);
      for (const [k, x] of Object.entries(v)) {
        assert.ok(k in s.properties, `${where}: unexpected property '${k}'`);
        validate(x, s.properties[k], `${where}.${k}`);
      }
      return;
    default: throw new Error(`validator: type ${s.type}`);
  }
}

const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 8 },
    ok: { type: 'boolean' },
    color: { enum: ['red', 'green', 'blue'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 4 }, maxItems: 3 },
    n: { type: 'integer' },
  },
  required: ['name', 'ok', 'color'],
  additionalProperties: false,
};

describe('serve: response_format and grammar', () => {
  let server, client;
  before(async () => {
    server = await startServer(['--chat-template', 'chatml', '--parallel', '8']);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  });
  after(async () => {
    server.proc.kill('SIGTERM');
    await server.exited;
  });

  test('json_schema on chat completions: 24 hot samples all parse and validate, properties in schema order', async () => {
    const answers = await Promise.all(Array.from({ length: 24 }, (_, i) => client.chat.completions.create({
      model: 'default',
      messages: [{ role: 'user', content: `Describe item ${i} as JSON.` }],
      temperature: 1.6,
      seed: 100 + i,
      max_tokens: 400,
      response_format: { type: 'json_schema', json_schema: { name: 'item', schema: SCHEMA, strict: true } },
    })));
    for (const r of answers) {
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'stop', c.message.content);
      const v = JSON.parse(c.message.content);
      validate(v, SCHEMA);
      const keys = Object.keys(v);
      const order = Object.keys(SCHEMA.properties).filter((k) => keys.includes(k));
      assert.deepEqual(keys, order);
    }
  });

  test('json_object on text completions gives a JSON object; streamed too', async () => {
    let complete = 0;
    for (let i = 0; i < 6; ++i) {
      const r = await client.completions.create({
        model: 'default', prompt: 'def f(x):', temperature: 1.0, seed: i, max_tokens: 300,
        response_format: { type: 'json_object' },
      });
      if (r.choices[0].finish_reason !== 'stop') continue;  // unbounded values may run out of tokens
      const v = JSON.parse(r.choices[0].text);
      assert.ok(v !== null && typeof v === 'object' && !Array.isArray(v), r.choices[0].text);
      ++complete;
    }
    assert.ok(complete >= 1, 'no json_object answer finished within max_tokens');
    const stream = await client.chat.completions.create({
      model: 'default', messages: [{ role: 'user', content: 'JSON please' }], temperature: 0.9, seed: 7,
      max_tokens: 400, stream: true,
      response_format: { type: 'json_schema', json_schema: { name: 'item', schema: SCHEMA } },
    });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    validate(JSON.parse(text), SCHEMA);
  });

  test('grammar (GBNF) on text completions', async () => {
    const r = await client.completions.create({
      model: 'default', prompt: 'Answer:', temperature: 1.5, seed: 3, max_tokens: 20,
      grammar: 'root ::= ("yes" | "no") "." [0-9]{2}',
    });
    assert.match(r.choices[0].text, /^(yes|no)\.[0-9]{2}$/);
    assert.equal(r.choices[0].finish_reason, 'stop');
  });

  test('400s name the unsupported schema keyword, the grammar\'s line and column, conflicting fields', async () => {
    const bad = async (body, param, pattern) => {
      const r = await postJson(server.url, '/v1/completions', { prompt: 'x', max_tokens: 4, ...body });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.json.error.param, param);
      assert.match(r.json.error.message, pattern);
    };
    await bad({ response_format: { type: 'json_schema', json_schema: { schema: { type: 'string', pattern: 'a+' } } } },
      'response_format', /the keyword 'pattern' \(at #\) is not supported/);
    await bad({ response_format: { type: 'json_schema', json_schema: { schema: { type: 'object', properties: { n: { type: 'integer', minimum: 1 } } } } } },
      'response_format', /'minimum' \(at #\/properties\/n\) is not supported/);
    await bad({ grammar: 'root ::= "a"\nb ::= [x' }, 'grammar', /grammar line 2, column 7: this character class is never closed/);
    await bad({ grammar: 'root ::= "a"', response_format: { type: 'json_object' } }, 'grammar', /cannot be combined/);
    await bad({ response_format: { type: 'xml' } }, 'response_format', /must be "text", "json_object" or "json_schema"/);
  });
});
