/* chat_source.h: where a model's chat template and BOS/EOS texts are found (a
 * GGUF's metadata; chat_template.jinja or tokenizer_config.json beside a
 * tokenizer.json or in a model directory), and every refusal with the file it
 * names. Files are written into a temporary directory. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tap.h"
#include "chat_source.h"

static char tmp[256];

static const char *at(const char *name)
{
    static char buf[4][512];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", tmp, name);
    return b;
}

static void put(const char *name, const void *data, size_t len)
{
    FILE *f = fopen(at(name), "wb");
    if (!f || fwrite(data, 1, len, f) != len)
        diag("cannot write %s", at(name));
    if (f)
        fclose(f);
}

static void put_str(const char *name, const char *s)
{
    put(name, s, strlen(s));
}

/* ---- a GGUF writer, just enough for metadata ---- */

typedef struct gbuf {
    unsigned char b[4096];
    size_t n;
} gbuf;

static void g_raw(gbuf *g, const void *p, size_t n)
{
    memcpy(g->b + g->n, p, n);
    g->n += n;
}

static void g_u32(gbuf *g, uint32_t v) { g_raw(g, &v, 4); }
static void g_u64(gbuf *g, uint64_t v) { g_raw(g, &v, 8); }

static void g_str(gbuf *g, const char *s)
{
    g_u64(g, strlen(s));
    g_raw(g, s, strlen(s));
}

/* A GGUF v3 with the template (NULL: none), three tokens and BOS/EOS ids. */
static size_t make_gguf(gbuf *g, const char *tpl, uint32_t bos, uint32_t eos)
{
    static const char *const tokens[] = { "<unk>", "<s>", "</s>" };

    g->n = 0;
    g_raw(g, "GGUF", 4);
    g_u32(g, 3);
    g_u64(g, 0);
    g_u64(g, tpl ? 4 : 3);
    if (tpl) {
        g_str(g, "tokenizer.chat_template");
        g_u32(g, 8);
        g_str(g, tpl);
    }
    g_str(g, "tokenizer.ggml.tokens");
    g_u32(g, 9);
    g_u32(g, 8);
    g_u64(g, 3);
    for (int i = 0; i < 3; i++)
        g_str(g, tokens[i]);
    g_str(g, "tokenizer.ggml.bos_token_id");
    g_u32(g, 4);
    g_u32(g, bos);
    g_str(g, "tokenizer.ggml.eos_token_id");
    g_u32(g, 4);
    g_u32(g, eos);
    while (g->n % 32)
        g->b[g->n++] = 0;
    return g->n;
}

/* Loads path; on success checks template, where, tokenizer path, bos and eos
 * (NULL: expected absent). */
static void finds(const char *path, const char *tpl, const char *where, const char *tok,
                  const char *bos, const char *eos, const char *name)
{
    kvg_chat_source s;
    char err[512];

    if (!ok(kvg_chat_source_load(path, &s, err, sizeof err) == 0, "%s: found", name)) {
        diag("  %s", err);
        return;
    }
    is_str(s.template_src, tpl, "  the template");
    is_int(s.template_len, strlen(tpl), "  its length");
    is_str(s.where, where, "  where: %s", where);
    is_str(s.tokenizer_path, tok, "  the vocabulary's file");
    is_str(s.bos_token, bos, "  bos_token");
    is_str(s.eos_token, eos, "  eos_token");
    kvg_chat_source_free(&s);
}

static void refuses(const char *path, const char *msg, const char *name)
{
    kvg_chat_source s;
    char err[512] = "";
    int rc = kvg_chat_source_load(path, &s, err, sizeof err);

    if (!ok(rc == -1 && strstr(err, msg) && !s.template_src && !s.where, "refused: %s", name))
        diag("  rc %d, '%s' (want it to hold '%s')", rc, err, msg);
}

static void test_gguf(void)
{
    gbuf g;
    char where[600];

    put("m.gguf", g.b, make_gguf(&g, "{{ bos_token }}hi", 1, 2));
    snprintf(where, sizeof where, "%s tokenizer.chat_template", at("m.gguf"));
    finds(at("m.gguf"), "{{ bos_token }}hi", where, at("m.gguf"), "<s>", "</s>",
          "a GGUF: its tokenizer.chat_template, BOS/EOS pieces by id");
    put("far.gguf", g.b, make_gguf(&g, "x", 7, 2));
    snprintf(where, sizeof where, "%s tokenizer.chat_template", at("far.gguf"));
    finds(at("far.gguf"), "x", where, at("far.gguf"), NULL, "</s>", "a BOS id past the vocabulary: no bos_token");
    put("none.gguf", g.b, make_gguf(&g, NULL, 1, 2));
    refuses(at("none.gguf"), "none.gguf: no chat template (the GGUF has no tokenizer.chat_template)",
            "a GGUF without a template");
    make_gguf(&g, "{{ x }}", 1, 2);
    put("cut.gguf", g.b, 40);
    refuses(at("cut.gguf"), "cut.gguf", "a truncated GGUF: the parser's error, naming the file");
}

static void test_hf(void)
{
    char where[600];

    mkdir(at("m"), 0755);
    put_str("m/tokenizer.json", "{\"model\": {}}");
    put_str("m/tokenizer_config.json",
            "{\"bos_token\": {\"content\": \"<|B|>\", \"lstrip\": false}, \"eos_token\": \"<|E|>\","
            " \"model_max_length\": 1000000000000000019884624838656, \"chat_template\": \"T{{ x }}\"}");
    snprintf(where, sizeof where, "%s chat_template", at("m/tokenizer_config.json"));
    finds(at("m"), "T{{ x }}", where, at("m/tokenizer.json"), "<|B|>", "<|E|>",
          "a model directory: tokenizer_config.json (an added-token bos, a 1e30 integer)");
    finds(at("m/tokenizer.json"), "T{{ x }}", where, at("m/tokenizer.json"), "<|B|>", "<|E|>",
          "its tokenizer.json: the same, from beside it");

    put_str("m/tokenizer_config.json",
            "{\"bos_token\": null, \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"U\"},"
            " {\"name\": \"default\", \"template\": \"D\"}]}");
    snprintf(where, sizeof where, "%s chat_template \"default\"", at("m/tokenizer_config.json"));
    finds(at("m"), "D", where, at("m/tokenizer.json"), NULL, NULL, "a list of named templates: \"default\"");

    put_str("m/chat_template.jinja", "J{{ y }}\n");
    finds(at("m"), "J{{ y }}\n", at("m/chat_template.jinja"), at("m/tokenizer.json"), NULL, NULL,
          "chat_template.jinja wins, byte for byte");
    unlink(at("m/chat_template.jinja"));

    put_str("m/tokenizer_config.json", "{\"chat_template\": [{\"name\": \"rag\", \"template\": \"R\"}]}");
    refuses(at("m"), "without one named \"default\"", "a list without \"default\"");
    put_str("m/tokenizer_config.json", "{\"chat_template\": 7}");
    refuses(at("m"), "chat_template is neither a string nor a list", "a template that is a number");
    put_str("m/tokenizer_config.json", "{\"chat_template\": \"x\",");
    refuses(at("m"), "tokenizer_config.json:1:", "a tokenizer_config.json that is not JSON: its place");
    put_str("m/tokenizer_config.json", "[]");
    refuses(at("m"), "tokenizer_config.json: not a JSON object", "a tokenizer_config.json not an object");
    put_str("m/tokenizer_config.json", "{}");
    refuses(at("m"), "no chat template (neither chat_template.jinja nor a chat_template in "
            "tokenizer_config.json)", "no template at all");
    unlink(at("m/tokenizer_config.json"));
    refuses(at("m"), "no chat template", "no tokenizer_config.json either");
}

static void test_other(void)
{
    put_str("tok.bin", "\x10\x00\x00\x00 binary vocabulary");
    refuses(at("tok.bin"), "a llama2.c tokenizer carries none", "a llama2.c tokenizer.bin");
    refuses(at("absent"), "absent: cannot open", "a path that does not exist");
    put("empty", "", 0);
    refuses(at("empty"), "no chat template", "an empty file");
}

int main(void)
{
    char cmd[300];

    snprintf(tmp, sizeof tmp, "/tmp/kvg-chat-source-XXXXXX");
    if (!mkdtemp(tmp)) {
        ok(0, "mkdtemp");
        return done_testing();
    }
    test_gguf();
    test_hf();
    test_other();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        diag("cannot remove %s", tmp);
    return done_testing();
}
