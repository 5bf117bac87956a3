// The official Anthropic SDK for TypeScript/JavaScript (@anthropic-ai/sdk, unmodified)
// against a running kvgate gateway's /v1/messages. Prints one JSON object of what it
// saw; t/gateway-anthropic-sdk.t checks it. Usage:
//   KVGATE_BASE_URL=http://127.0.0.1:PORT KVGATE_LONG_SYSTEM='...' node anthropic-sdk.mjs
import Anthropic from '@anthropic-ai/sdk';

const base = process.env.KVGATE_BASE_URL;
const longSystem = process.env.KVGATE_LONG_SYSTEM;
const model = 'stories260K';
const client = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0,
                               defaultHeaders: { 'X-Tenant-Id': 'anthropic-sdk' } });
const out = {};
const story = [{ role: 'user', content: 'Tell me a story' }];

async function errorOf(p) {
    try {
        await p;
        return { thrown: false };
    } catch (e) {
        return { thrown: true, class: e.constructor.name, status: e.status ?? null,
                 type: e.error?.error?.type ?? null, message: e.error?.error?.message ?? e.message };
    }
}

// messages.create, not streamed
const m = await client.messages.create({ model, max_tokens: 24, temperature: 0, messages: story });
out.create = { id: m.id, type: m.type, role: m.role, model: m.model, content: m.content,
               text: m.content.map((b) => b.text).join(''), stop_reason: m.stop_reason,
               stop_sequence: m.stop_sequence, usage: m.usage };

// a stop sequence
const word = out.create.text.trim().split(/\s+/)[1] ?? out.create.text.slice(2, 4);
const ms = await client.messages.create({ model, max_tokens: 24, temperature: 0, messages: story,
                                          stop_sequences: ['zzqq', word] });
out.stop = { word, text: ms.content[0].text, stop_reason: ms.stop_reason, stop_sequence: ms.stop_sequence };

// messages.stream: the helper's text events and its final message
{
    const stream = client.messages.stream({ model, max_tokens: 24, temperature: 0, messages: story });
    let text = '';
    stream.on('text', (t) => { text += t; });
    const final = await stream.finalMessage();
    out.stream = { text, final_text: final.content.map((b) => b.text).join(''), stop_reason: final.stop_reason,
                   stop_sequence: final.stop_sequence, usage: final.usage, id: final.id };
}

// messages.create({stream: true}): the raw events
{
    const events = await client.messages.create({ model, max_tokens: 24, temperature: 0, messages: story,
                                                  stream: true });
    const types = [];
    let text = '';
    let startUsage = null;
    let deltaUsage = null;
    let stopReason = null;
    for await (const ev of events) {
        types.push(ev.type);
        if (ev.type === 'message_start') startUsage = ev.message.usage;
        if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
        if (ev.type === 'message_delta') {
            deltaUsage = ev.usage;
            stopReason = ev.delta.stop_reason;
        }
    }
    out.raw_stream = { types, text, start_usage: startUsage, delta_usage: deltaUsage, stop_reason: stopReason };
}

// the prefix cache: a long system prompt with a cache_control breakpoint, twice
{
    const req = { model, max_tokens: 8, temperature: 0,
                  system: [{ type: 'text', text: longSystem, cache_control: { type: 'ephemeral', ttl: '5m' } }],
                  messages: [{ role: 'user', content: [{ type: 'text', text: 'Who is in the story?' }] }] };
    const first = await client.messages.create(req);
    const second = await client.messages.create(req);
    const streamed = await client.messages.stream(req).finalMessage();
    out.cache = { first: first.usage, second: second.usage, streamed: streamed.usage,
                  same_text: first.content[0].text === second.content[0].text };
}

// errors: the SDK's own classes
out.err_max_tokens = await errorOf(client.messages.create({ model, messages: story }));
out.err_model = await errorOf(client.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 4, messages: story }));
out.err_image = await errorOf(client.messages.create({ model, max_tokens: 4, messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] }));
{
    const cc = (text) => ({ type: 'text', text, cache_control: { type: 'ephemeral' } });
    out.err_breakpoints = await errorOf(client.messages.create({ model, max_tokens: 4,
        system: [cc('a'), cc('b'), cc('c')], messages: [{ role: 'user', content: [cc('d'), cc('e')] }] }));
}
out.err_ttl = await errorOf(client.messages.create({ model, max_tokens: 4, messages: [{ role: 'user', content: [
    { type: 'text', text: 'x', cache_control: { type: 'ephemeral', ttl: '2h' } }] }] }));
{
    const strict = new Anthropic({ baseURL: `${base}/strict`, apiKey: 'unused', maxRetries: 0 });
    out.err_tenant = await errorOf(strict.messages.create({ model, max_tokens: 4, messages: story }));
}
out.err_stream = await errorOf((async () => {
    const s = client.messages.stream({ model, messages: story });
    await s.finalMessage();
})());

console.log(JSON.stringify(out));
