// Chat templates in `mambacpp serve`: the model's own Jinja template (here the published Qwen3 and Mistral Nemo
// templates, given with --chat-template FILE to the shipped model), /apply-template, the OpenAI client's chat
// completions over it, and the CLI's `generate --chat` rendering the same prompt. The expected prompts are what
// transformers' apply_chat_template renders for these conversations (Jinja with trim_blocks + lstrip_blocks and
// transformers' tojson).
import assert from 'node:assert/strict';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';

import { generate, postJson, startServer, writeScratch } from './support.mjs';

const templates = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../fixtures/chat/templates');
const QWEN3 = path.join(templates, 'Qwen-Qwen3-0.6B.jinja');
const MISTRAL_NEMO = path.join(templates, 'mistralai-Mistral-Nemo-Instruct-2407.jinja');
const NEMOTRON3 = path.join(templates, 'NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja');

const TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

describe('serve --chat-template <Qwen3 template>', () => {
  let server, client;
  before(async () => {
    server = await startServer(['--chat-template', QWEN3]);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  });
  after(async () => {
    server.proc.kill('SIGTERM');
    await server.exited;
  });

  test('/apply-template renders as transformers: enable_thinking, tools in the client\'s key order, no generation prompt', async () => {
    const thinkingOff = await postJson(server.url, '/apply-template', {
      messages: [{ role: 'user', content: 'hi' }],
      chat_template_kwargs: { enable_thinking: false },
    });
    assert.equal(thinkingOff.status, 200, thinkingOff.text);
    assert.equal(thinkingOff.json.prompt, '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n');

    const withTools = await postJson(server.url, '/apply-template', {
      messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Weather in Paris?' }],
      tools: TOOLS,
    });
    assert.equal(withTools.status, 200, withTools.text);
    assert.equal(withTools.json.prompt,
      '<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' +
      'You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n' +
      '{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", ' +
      '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n' +
      '</tools>\n\nFor each function call, return a json object with function name and arguments within ' +
      '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n' +
      '</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n');

    // tool_choice "none": the tools are not offered.
    const none = await postJson(server.url, '/apply-template', {
      messages: [{ role: 'user', content: 'hi' }], tools: TOOLS, tool_choice: 'none',
    });
    assert.ok(!none.json.prompt.includes('<tools>'), none.json.prompt);

    // Text parts join with "\n"; add_generation_prompt false ends after the last turn.
    const parts = await postJson(server.url, '/apply-template', {
      messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] }],
      add_generation_prompt: false,
    });
    assert.equal(parts.json.prompt, '<|im_start|>user\na\nb<|im_end|>\n');
  });

  test('chat completion: usage.prompt_tokens counts the rendered prompt; greedy text equals `generate --chat`', async () => {
    const messages = [{ role: 'user', content: 'Write a haiku about state space models.' }];
    const kwargs = { enable_thinking: false };
    const { json: applied } = await postJson(server.url, '/apply-template', { messages, chat_template_kwargs: kwargs });
    const { json: tokenized } = await postJson(server.url, '/tokenize', { content: applied.prompt });
    const r = await client.chat.completions.create({
      model: 'x', messages, max_tokens: 16, temperature: 0, chat_template_kwargs: kwargs,
    });
    assert.equal(r.usage.prompt_tokens, tokenized.tokens.length);

    const [ref] = generate(['--chat', '--chat-template', QWEN3, '-p', messages[0].content, '--chat-kwargs',
      JSON.stringify(kwargs), '-n', '16', '--temp', '0']);
    assert.deepEqual(ref.prompt_tokens, tokenized.tokens);
    assert.equal(r.choices[0].message.content, ref.text);

    // The same conversation from a file, as the server's body.
    const file = writeScratch('chat.json', JSON.stringify({ messages, chat_template_kwargs: kwargs }));
    const [fromFile] = generate(['--chat', '--chat-template', QWEN3, '--chat-file', file, '-n', '16', '--temp', '0']);
    assert.deepEqual(fromFile.prompt_tokens, tokenized.tokens);
  });

  test('malformed chat fields get a 400 naming them', async () => {
    for (const [body, param] of [
      [{ messages: [{ role: 'user', content: 'x' }], tools: 'get_weather' }, 'tools'],
      [{ messages: [{ role: 'user', content: 'x' }], tools: [{ type: 'function' }] }, 'tools[0]'],
      [{ messages: [{ role: 'user', content: 'x' }], chat_template_kwargs: [1] }, 'chat_template_kwargs'],
      [{ messages: [{ role: 'user', content: 'x' }], tool_choice: 'required' }, 'tool_choice'],
      [{ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, 'messages[0].content[0]'],
      [{ messages: [{ role: 'robot', content: 'x' }] }, 'messages[0].role'],
    ]) {
      const r = await postJson(server.url, '/apply-template', body);
      assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
      assert.equal(r.json.error.param, param, r.text);
    }
  });
});

describe('serve --chat-template <Mistral Nemo template>', () => {
  let server, client;
  before(async () => {
    server = await startServer(['--chat-template', MISTRAL_NEMO]);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  });
  after(async () => {
    server.proc.kill('SIGTERM');
    await server.exited;
  });

  test('a template that raises gives a 400 carrying its message', async () => {
    const messages = [{ role: 'user', content: 'a' }, { role: 'user', content: 'b' }];
    await assert.rejects(client.chat.completions.create({ model: 'x', messages, max_tokens: 4 }),
      (e) => e.status === 400 && /conversation roles must alternate user\/assistant/.test(e.message));
    const r = await postJson(server.url, '/apply-template', { messages });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /roles must alternate/);
  });
});

describe('serve --chat-template <Nemotron 3 Nano template>', () => {
  let server, client;
  before(async () => {
    server = await startServer(['--chat-template', NEMOTRON3]);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  });
  after(async () => {
    server.proc.kill('SIGTERM');
    await server.exited;
  });

  test('a prompt that opens <think> makes the answer reasoning_content, whole and streamed', async () => {
    const messages = [{ role: 'user', content: 'Is 7 prime?' }];
    const { json: applied } = await postJson(server.url, '/apply-template', { messages });
    assert.ok(applied.prompt.endsWith('<|im_start|>assistant\n<think>\n'), applied.prompt);
    const [ref] = generate(['--chat', '--chat-template', NEMOTRON3, '-p', messages[0].content, '-n', '12', '--temp', '0']);
    assert.ok(!ref.text.includes('</think>'), ref.text);

    const r = await client.chat.completions.create({ model: 'x', messages, max_tokens: 12, temperature: 0 });
    assert.equal(r.choices[0].message.reasoning_content ?? '', ref.text.trim());
    assert.equal(r.choices[0].message.content, '');

    const stream = await client.chat.completions.create({ model: 'x', messages, max_tokens: 12, temperature: 0, stream: true });
    let reasoning = '';
    let content = '';
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        reasoning += c.delta.reasoning_content ?? '';
        content += c.delta.content ?? '';
      }
    }
    assert.equal(reasoning, ref.text);
    assert.equal(content, '');
  });
});

describe('serve --chat-template FILE that does not parse', () => {
  test('refuses to start, naming the line and column', async () => {
    const file = writeScratch('broken.jinja', '{% for m in messages %}\n{{ m.content }\n{% endfor %}');
    await assert.rejects(startServer(['--chat-template', file]), (e) => /line 2, column/.test(e.message));
  });
});
