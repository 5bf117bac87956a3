// The official OpenAI SDK for JavaScript against a running kvgate gateway. Prints one
// JSON object of what it saw; t/gateway-sdk.t checks it. Usage:
//   KVGATE_BASE_URL=http://127.0.0.1:PORT/v1 node openai-sdk.mjs
import OpenAI from 'openai';

const base = process.env.KVGATE_BASE_URL;
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0,
                            defaultHeaders: { 'X-Tenant-Id': 'sdk' } });
const out = {};

async function errorOf(p) {
    try {
        await p;
        return { thrown: false };
    } catch (e) {
        return { thrown: true, class: e.constructor.name, status: e.status, code: e.code ?? null,
                 param: e.param ?? null, type: e.type ?? null, message: e.message };
    }
}

const models = await client.models.list();
out.models = models.data.map((m) => m.id);
out.model = (await client.models.retrieve(out.models[0])).id;

const model = out.models[0];
const c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 196, temperature: 0 });
out.completion_text = c.choices[0].text;
out.completion_usage = c.usage;
out.completion_object = c.object;

const { data: c2, response } = await client.completions
    .create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0 })
    .withResponse();
out.cache_header = response.headers.get('x-kvgate-cache');
out.bucket_header = response.headers.get('x-kvgate-bucket');
out.short_text = c2.choices[0].text;

let streamed = '';
const cs = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 196, temperature: 0,
                                             stream: true });
for await (const chunk of cs) streamed += chunk.choices[0]?.text ?? '';
out.completion_stream_text = streamed;

const messages = [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Once upon a time' }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
out.chat_text = chat.choices[0].message.content;
out.chat_role = chat.choices[0].message.role;
out.chat_finish = chat.choices[0].finish_reason;

// OpenAI's caching fields through the SDK: a long prompt twice, the second served cached
const longMessages = [{ role: 'user', content: 'Once upon a time there was a little girl named Lily. '.repeat(16) }];
const k1 = await client.chat.completions.create({ model, messages: longMessages, max_tokens: 8, temperature: 0,
                                                  prompt_cache_key: 'sdk-test', prompt_cache_retention: '24h' });
const k2 = await client.chat.completions.create({ model, messages: longMessages, max_tokens: 8, temperature: 0,
                                                  prompt_cache_key: 'sdk-test', prompt_cache_retention: '24h' });
out.cache_key = { first: k1.usage, second: k2.usage, same: k1.choices[0].message.content === k2.choices[0].message.content };

let chatStreamed = '';
let usage = null;
const stream = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, stream: true,
                                                      stream_options: { include_usage: true } });
for await (const chunk of stream) {
    chatStreamed += chunk.choices[0]?.delta?.content ?? '';
    if (chunk.usage) usage = chunk.usage;
}
out.chat_stream_text = chatStreamed;
out.chat_stream_usage = usage;

const n = await client.completions.create({ model, prompt: 'Lily and Tom', max_tokens: 12, temperature: 0.9, seed: 7, n: 2 });
const n2 = await client.completions.create({ model, prompt: 'Lily and Tom', max_tokens: 12, temperature: 0.9, seed: 7, n: 2 });
out.n_texts = n.choices.map((x) => x.text);
out.n_texts_again = n2.choices.map((x) => x.text);

// self-consistency: the kvgate extension passes through as an extra body field, and the
// response's (and the stream's last chunk's) kvgate object stays on what the SDK returns
const sc = await client.completions.create({
    model, prompt: 'Lily and Tom went to the park. They saw a big dog. The dog ran to', n: 6, seed: 7,
    temperature: 0.8, max_tokens: 24,
    kvgate: { vote: 'majority', answer_pattern: '(Lily|Tom|Ben|Sue|Max|Anna|Sam|Mia|Tim)', min_samples: 3,
              agreement: 0.6 },
});
out.sc = sc.kvgate ?? null;
out.sc_choices = sc.choices.map((x) => x.index);
let scStream = null;
let scChunks = 0;
const scs = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0.8, seed: 7, n: 4,
                                                   stream: true, kvgate: { vote: 'majority' } });
for await (const chunk of scs) {
    scChunks++;
    if (chunk.kvgate) scStream = chunk.kvgate;
}
out.sc_stream = scStream;

out.err_model = await errorOf(client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 2 }));
out.err_param = await errorOf(client.completions.create({ model, prompt: 'x', max_tokens: 2, temperature: 5 }));
out.err_context = await errorOf(client.completions.create({ model, prompt: 'word '.repeat(700), max_tokens: 2 }));
// a self-consistency pattern that backtracks without end: refused, 422, as the SDK knows it
out.err_pattern = await errorOf(client.completions.create({
    model, prompt: 'Lily and Tom went to the park. They saw a big dog. The dog ran to', max_tokens: 60,
    temperature: 1.0, n: 4, seed: 7,
    kvgate: { vote: 'majority', answer_pattern: '(?s)(?:.|.){1,14}\\d{9}|(.)' } }));

console.log(JSON.stringify(out));
