// npm side of t/bench/tokenize: encodes the same text with gpt-tokenizer
// (r50k_base, the GPT-2 vocabulary) and tiktoken (gpt2), whole and as prompts
// cut exactly as tokenize_bench.c cuts them, and prints
//   RESULT <label> <chunk> <MB/s> <tokens/s> <tokens> <reps>
// usage: node tokenize_npm.mjs TEXT CHUNK...
import { readFileSync } from 'node:fs';
import { encode as gptEncode } from 'gpt-tokenizer/encoding/r50k_base';
import { get_encoding } from 'tiktoken';

const [textPath, ...chunkArgs] = process.argv.slice(2);
const bytes = readFileSync(textPath);
const chunks = chunkArgs.map(Number);

// Same prompt boundaries as the C driver: at most `chunk` bytes, backed off to
// the start of a UTF-8 character.
function prompts(chunk) {
  const out = [];
  for (let at = 0; at < bytes.length;) {
    let e = bytes.length;
    if (chunk > 0 && bytes.length - at > chunk) {
      e = at + chunk;
      while (e > at + 1 && (bytes[e] & 0xc0) === 0x80) e--;
    }
    out.push(bytes.toString('utf8', at, e));
    at = e;
  }
  return out;
}

// CPU time of the whole process (all of node's threads, as the C driver's
// process CPU time), in seconds: the machines are shared, and time spent
// descheduled says nothing about the tokenizer.
function cpu() {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

function bench(label, encode, chunk) {
  const texts = prompts(chunk);
  const pass = () => {
    let tokens = 0;
    for (const t of texts) tokens += encode(t).length;
    return tokens;
  };
  const tokens = pass(); // warm-up (JIT, caches)
  const times = [];
  const start = cpu();
  while (times.length < 64 && (times.length < 5 || cpu() - start < 1.5)) {
    const t0 = cpu();
    if (pass() !== tokens) throw new Error('token count changed between passes');
    times.push(cpu() - t0);
  }
  times.sort((a, b) => a - b);
  const med = times[times.length >> 1];
  console.log(`RESULT ${label} ${chunk} ${(bytes.length / med / 1e6).toFixed(2)} ` +
              `${(tokens / med).toFixed(0)} ${tokens} ${times.length}`);
}

for (const chunk of chunks) bench('gpt-tokenizer', (t) => gptEncode(t), chunk);
const enc = get_encoding('gpt2');
for (const chunk of chunks) bench('tiktoken', (t) => enc.encode(t), chunk);
enc.free();
