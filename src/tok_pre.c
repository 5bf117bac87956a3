/* GGUF tokenizer.ggml.pre names -> the pre-tokenizer each model's own
 * tokenizer.json applies (its sequence of Split regexes, Isolated) and the
 * per-name flags llama.cpp sets with it.
 *
 * The patterns are written as the models' tokenizer.json files have them
 * (Hugging Face / Oniguruma syntax), not in llama.cpp's std::regex-friendly
 * rewrites: they run on PCRE2 (pretok_re.c), or on a hand-written scanner when
 * the text is one the scanners implement. HF pre-tokenizers other than Split
 * are written as the Split they are: Digits(individual_digits) is \p{N}
 * (\p{N}+ without), Punctuation is [\p{P} + ASCII punctuation]+ .
 *
 * Adding a model whose pre-tokenizer is a new regex list is one table row. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|" \
                  " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|" \
                 " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen3.5: marks (\p{M}) join letters. */
#define RE_QWEN35 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}|" \
                  " ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* o200k (GPT-4o, gpt-oss, Llama 4, Phi-4-mini): words split at case changes. */
#define RE_O200K_WORD(contr) \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" contr "|" \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" contr "|"
#define RE_CONTR_OPT "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
#define RE_O200K RE_O200K_WORD(RE_CONTR_OPT) \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Mistral's tekken: o200k's shape without contractions, single digits. */
#define RE_TEKKEN RE_O200K_WORD("") \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Kimi K2: Han runs first, and letters exclude Han (the file's tiktoken pattern
 * says [\p{Lu}...&&[^\p{Han}]]; PCRE2 10.42 has no class intersection, so each
 * such class is a lookahead-guarded character). */
#define KIMI_UP "(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"
#define KIMI_LO "(?:(?!\\p{Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"
#define RE_KIMI "\\p{Han}+|" \
    "[^\\r\\n\\p{L}\\p{N}]?" KIMI_UP "*" KIMI_LO "+" RE_CONTR_OPT "|" \
    "[^\\r\\n\\p{L}\\p{N}]?" KIMI_UP "+" KIMI_LO "*" RE_CONTR_OPT "|" \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* DeepSeek V3 / R1: three splits. */
#define RE_DSV3_WORD "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|" \
    "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
/* DeepSeek LLM / Coder: CJK ideographs, then the range U+0800..U+4E00 and Hangul. */
#define RE_DS_CJK "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+"
/* DeepSeek LLM's cased-letter class (Latin, Greek, Cyrillic, Armenian, Georgian,
 * Cherokee, Glagolitic, Coptic, Deseret, Osage, Old Hungarian, Warang Citi,
 * Adlam ... as its tokenizer.json lists them). */
#define RE_DSLLM_LETTERS "\\s?[A-Za-z\xc2\xb5\xc3\x80-\xc3\x96\xc3\x98-\xc3\xb6\xc3\xb8-\xc6\xba" \
    "\xc6\xbc-\xc6\xbf\xc7\x84-\xca\x93\xca\x95-\xca\xaf\xcd\xb0-\xcd\xb3\xcd\xb6\xcd\xb7" \
    "\xcd\xbb-\xcd\xbd\xcd\xbf\xce\x86\xce\x88-\xce\x8a\xce\x8c\xce\x8e-\xce\xa1\xce\xa3-\xcf\xb5" \
    "\xcf\xb7-\xd2\x81\xd2\x8a-\xd4\xaf\xd4\xb1-\xd5\x96\xe1\x82\xa0-\xe1\x83\x85" \
    "\xe1\x8e\xa0-\xe1\x8f\xb5\xe1\x8f\xb8-\xe1\x8f\xbd\xe1\xb2\x90-\xe1\xb2\xba" \
    "\xe1\xb2\xbd-\xe1\xb2\xbf\xe1\xb4\x80-\xe1\xb4\xab\xe1\xb5\xab-\xe1\xb5\xb7" \
    "\xe1\xb5\xb9-\xe1\xb6\x9a\xe1\xb8\x80-\xe1\xbc\x95\xe1\xbc\x98-\xe1\xbc\x9d" \
    "\xe1\xbc\xa0-\xe1\xbd\x85\xe1\xbd\x88-\xe1\xbd\x8d\xe1\xbd\x90-\xe1\xbd\x97\xe1\xbd\x99" \
    "\xe1\xbd\x9b\xe1\xbd\x9d\xe1\xbd\x9f-\xe1\xbd\xbd\xe1\xbe\x80-\xe1\xbe\xb4" \
    "\xe1\xbe\xb6-\xe1\xbe\xbc\xe1\xbe\xbe\xe1\xbf\x82-\xe1\xbf\x84\xe1\xbf\x86-\xe1\xbf\x8c" \
    "\xe1\xbf\x90-\xe1\xbf\x93\xe1\xbf\x96-\xe1\xbf\x9b\xe1\xbf\xa0-\xe1\xbf\xac" \
    "\xe1\xbf\xb2-\xe1\xbf\xb4\xe1\xbf\xb6-\xe1\xbf\xbc\xe2\x84\x82\xe2\x84\x87" \
    "\xe2\x84\x8a-\xe2\x84\x93\xe2\x84\x95\xe2\x84\x99-\xe2\x84\x9d\xe2\x84\xa4\xe2\x84\xa6" \
    "\xe2\x84\xa8\xe2\x84\xaa-\xe2\x84\xad\xe2\x84\xaf-\xe2\x84\xb4\xe2\x84\xb9" \
    "\xe2\x84\xbc-\xe2\x84\xbf\xe2\x85\x85-\xe2\x85\x89\xe2\x85\x8e\xe2\x86\x83\xe2\x86\x84" \
    "\xe2\xb0\x80-\xe2\xb1\xbb\xe2\xb1\xbe-\xe2\xb3\xa4\xe2\xb3\xab-\xe2\xb3\xae" \
    "\xe2\xb3\xb2\xe2\xb3\xb3\xea\x99\x80-\xea\x99\xad\xea\x9a\x80-\xea\x9a\x9b" \
    "\xea\x9c\xa2-\xea\x9d\xaf\xea\x9d\xb1-\xea\x9e\x87\xea\x9e\x8b-\xea\x9e\x8e" \
    "\xea\xad\xb0-\xea\xae\xbf\xef\xac\x80-\xef\xac\x86\xef\xac\x93-\xef\xac\x97" \
    "\xef\xbc\xa1-\xef\xbc\xba\xef\xbd\x81-\xef\xbd\x9a\xf0\x90\x90\x80-\xf0\x90\x91\x8f" \
    "\xf0\x90\x92\xb0-\xf0\x90\x93\x93\xf0\x90\x93\x98-\xf0\x90\x93\xbb" \
    "\xf0\x90\xb2\x80-\xf0\x90\xb2\xb2\xf0\x90\xb3\x80-\xf0\x90\xb3\xb2" \
    "\xf0\x91\xa2\xa0-\xf0\x91\xa3\x9f\xf0\x9e\xa4\x80-\xf0\x9e\xa5\x83]+"
/* ASCII and full-width punctuation, quotes U+2018..U+201F, U+3000..U+3002. */
#define RE_DSLLM_PUNCT "\\s?[!-/:-~\xef\xbc\x81-\xef\xbc\x8f\xef\xbc\x9a-\xef\xbd\x9e" \
    "\xe2\x80\x98-\xe2\x80\x9f\xe3\x80\x80-\xe3\x80\x82]+"
/* HF Punctuation: Unicode P* plus the ASCII punctuation that Unicode calls symbols. */
#define RE_PUNCT "[\\p{P}\\$\\+<=>\\^~\\|`]+"

typedef struct pre_def {
    const char *names[10];       /* the tokenizer.ggml.pre values (NULL-ended) */
    const char *re[7];           /* Split regexes, in order (NULL-ended) */
    int ignore_merges;           /* a pre-token that is a piece is not merged */
    int add_bos;                 /* BOS by default (the GGUF key overrides) */
    int no_bos;                  /* the vocabulary has no BOS unless the GGUF names one */
} pre_def;

static const pre_def defs[] = {
    { { "gpt-2", "default", "mpt", "phi-2", "olmo", "jais", "jina-es", "jina-de", "exaone4", NULL },
      { RE_GPT2 }, 0, 0, 0 },
    { { "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "trillion",
        "granite-docling", NULL },
      { RE_GPT2 }, 0, 0, 0 },
    { { "llama3", "llama-bpe", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "jina-v5-nano", NULL },
      { RE_LLAMA3 }, 1, 1, 0 },
    { { "dbrx", "smaug-bpe", NULL }, { RE_LLAMA3 }, 0, 0, 0 },
    { { "glm4", "chatglm-bpe", NULL }, { RE_LLAMA3 }, 0, 0, 1 },
    { { "qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan", "solar-open", "kormo",
        "f2llmv2", "grok-2", NULL },
      { RE_QWEN2 }, 0, 0, 0 },
    { { "qwen35", NULL }, { RE_QWEN35 }, 0, 0, 0 },
    { { "gpt-4o", "llama4", "minimax-m2", "kanana2", NULL }, { RE_O200K }, 0, 0, 0 },
    { { "tekken", NULL }, { RE_TEKKEN }, 1, 1, 0 },
    { { "kimi-k2", NULL }, { RE_KIMI }, 0, 0, 0 },
    { { "deepseek-v3", "hunyuan-dense", "joyai-llm", NULL },
      { "\\p{N}{1,3}", "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
        RE_DSV3_WORD }, 0, 0, 0 },
    { { "deepseek-llm", NULL },
      { "[\r\n]", RE_DSLLM_LETTERS, RE_DSLLM_PUNCT, "\\s+$", RE_DS_CJK, "\\p{N}+" }, 0, 0, 0 },
    { { "deepseek-coder", NULL },
      { "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DS_CJK, "\\p{N}" }, 0, 0, 0 },
    { { "falcon", NULL }, { RE_PUNCT, RE_GPT2, "[0-9][0-9][0-9]" }, 0, 0, 0 },
    { { "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", NULL },
      { "\\p{N}", RE_GPT2 }, 0, 0, 0 },
};

int kvg_tok_gguf_pre(struct kvg_tokenizer *t, const char *pre, size_t len, char *err,
                     size_t err_len)
{
    const pre_def *d = NULL;
    for (size_t i = 0; !d && i < sizeof defs / sizeof *defs; i++)
        for (const char *const *n = defs[i].names; *n; n++)
            if (strlen(*n) == len && memcmp(*n, pre, len) == 0) {
                d = &defs[i];
                break;
            }
    if (!d)
        return 1;
    size_t n_re = 0;
    while (n_re < sizeof d->re / sizeof *d->re && d->re[n_re])
        n_re++;
    kvg_pretok_stage *st = calloc(n_re, sizeof *st);
    if (!st) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n_re; i++)
        if (kvg_pretok_stage_regex(&st[i], d->re[i], strlen(d->re[i]), KVG_SPLIT_ISOLATED, 0,
                                   err, err_len) < 0) {
            kvg_pretok_stages_free(st, i);
            return -1;
        }
    kvg_tok_set_stages(t, st, n_re);
    t->ignore_merges = d->ignore_merges;
    t->add_bos = d->add_bos;
    if (d->no_bos)
        t->bos = -1;
    return 0;
}
