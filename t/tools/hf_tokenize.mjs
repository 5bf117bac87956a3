// The Hugging Face reference for t/tokenizer-hf.t and t/bench/tokenize: encodes
// text with a tokenizer.json through a JavaScript implementation of Hugging Face
// tokenizers, installed by t/lib/Kvgate/Npm.pm into $BUILD/npm (MODULES below is
// its node_modules).
//
//   node hf_tokenize.mjs [--lib hf|lenml] MODULES TOKENIZER_JSON CORPUS_JSON
//       prints one JSON object: {library, version, results: [{name, ids, pieces,
//       special_text}]}, one result per corpus string (t/tokenizer-corpus.json),
//       ids = encode(text, {add_special_tokens: false}).ids, pieces their
//       vocabulary strings; special_text: the text holds the content of a special
//       added token (see below). A string the library throws on has {error}.
//   node hf_tokenize.mjs [--lib hf|lenml] MODULES --bench TOKENIZER_JSON TEXT LABEL CHUNK...
//       t/bench/tokenize's figures: TEXT cut into prompts exactly as
//       t/bench/tokenize_bench.c cuts them, one line per CHUNK:
//         RESULT <label> <chunk> <MB/s> <tokens/s> <tokens> <reps>
//
// --lib hf (the default) is @huggingface/tokenizers, the Hugging Face team's own
// JavaScript port: it translates the Oniguruma patterns of tokenizer.json to
// JavaScript in general ((?i:...) groups, \s as White_Space: JavaScript's \s adds
// U+FEFF and lacks U+0085), where @lenml/tokenizers (--lib lenml, a fork of an
// older transformers.js) rewrites a fixed list of known patterns and runs the rest
// as JavaScript regexes. Both read only tokenizer.json here, as the Rust
// `tokenizers` library does (tokenizer_config.json is for transformers).
// t/tokenizer-hf.t checks the reference against the Rust library's ids first
// (llama.cpp's vectors). Unicode properties and NFC come from Node's own tables
// (Node 20: Unicode 15.1, as Oniguruma 6.9.9 and later); the corpus's unicode15-*
// strings check that kvgate's tables are as new.
//
// Added tokens: Hugging Face always cuts the text at every added token's content,
// special or not (unless split_special_tokens, which neither port has), before
// normalizing and pre-tokenizing the pieces between. kvgate does the same for
// non-special added tokens, and for special ones only when asked to
// (kvgate-tokenize --special, KVG_ENC_PARSE_SPECIAL). So kvgate --special is
// comparable with these ids on every string, and kvgate without --special only on
// a string that holds no special token's content (special_text false).
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';

let args = process.argv.slice(2);
let lib = 'hf';
if (args[0] === '--lib') {
  lib = args[1];
  args = args.slice(2);
}
const [modules, ...rest] = args;
if (!modules || !['hf', 'lenml'].includes(lib)) {
  console.error('usage: node hf_tokenize.mjs [--lib hf|lenml] MODULES TOKENIZER_JSON CORPUS_JSON\n' +
                '       node hf_tokenize.mjs [--lib hf|lenml] MODULES --bench TOKENIZER_JSON TEXT LABEL CHUNK...');
  process.exit(2);
}
const require = createRequire(join(resolve(modules), 'hf_tokenize.cjs'));
const pkgName = lib === 'hf' ? '@huggingface/tokenizers' : '@lenml/tokenizers';
const version = JSON.parse(readFileSync(join(modules, pkgName, 'package.json'), 'utf8')).version;

function load(path) {
  const json = JSON.parse(readFileSync(path, 'utf8'));
  let encode;
  if (lib === 'hf') {
    const { Tokenizer } = require('@huggingface/tokenizers');
    const tok = new Tokenizer(json, {});
    encode = (text) => {
      const e = tok.encode(text, { add_special_tokens: false });
      return { ids: e.ids, pieces: e.tokens };
    };
  } else {
    const { TokenizerLoader } = require('@lenml/tokenizers');
    const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: {} });
    encode = (text) => {
      const ids = tok.encode(text, { add_special_tokens: false });
      return { ids, pieces: tok.model.convert_ids_to_tokens(ids) };
    };
  }
  const specials = (json.added_tokens || []).filter((a) => a.special).map((a) => a.content);
  return { encode, specials };
}

// CPU time of the whole process, in seconds (as tokenize_npm.mjs and the C driver).
function cpu() {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

// The prompt boundaries of tokenize_bench.c: at most `chunk` bytes, backed off to
// the start of a UTF-8 character.
function prompts(bytes, chunk) {
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

if (rest[0] === '--bench') {
  const [, tokPath, textPath, label, ...chunks] = rest;
  const { encode } = load(tokPath);
  const bytes = readFileSync(textPath);
  for (const chunk of chunks.map(Number)) {
    const texts = prompts(bytes, chunk);
    const pass = () => texts.reduce((n, t) => n + encode(t).ids.length, 0);
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
} else {
  const [tokPath, corpusPath] = rest;
  const { encode, specials } = load(tokPath);
  const corpus = JSON.parse(readFileSync(corpusPath, 'utf8')).strings;
  const results = corpus.map(({ name, text }) => {
    let ids;
    let pieces;
    let error;
    try {
      const e = encode(text);
      ids = Array.from(e.ids, Number);
      pieces = Array.from(e.pieces, String);
    } catch (e) {
      error = String(e && e.message || e);
    }
    return { name, ids, pieces, error, special_text: specials.some((s) => s.length && text.includes(s)) };
  });
  process.stdout.write(JSON.stringify({ library: pkgName, version, results }) + '\n');
}
