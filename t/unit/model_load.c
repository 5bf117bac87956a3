/* Model loading: llama2.c (legacy and "ak42" v1), GGUF (F32/F16/BF16), Hugging Face
 * directories (single file, shards, misaligned data), synthetic models, the model
 * identity, the llama2.c exporter, and the error messages.
 *
 * The same stories260K weights are written in every format (t/unit/model_writers.h)
 * and each load must give back the llama2.c weights: bit for bit in F32, exactly the
 * rounded values in F16/BF16, and for HF with Q/K in rotate-half order, un-permuting
 * must restore the original rows. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "model_testing.h"
#include "model_writers.h"
#include "quant.h"
#include "quant_testing.h"
#include "tap.h"
#include "tokenizer_testing.h"

static char tmpdir[256];
static char model_path[512], tok_path[512];

static void tmp(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmpdir, name);
}

static void rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            rm_rf(sub);
        }
        if (d)
            closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static int write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    int rc = f && fwrite(p, 1, n, f) == n ? 0 : -1;
    if (f && fclose(f) != 0)
        rc = -1;
    return rc;
}

static kvg_model *load(const char *path, const char *tok, char *err, size_t err_len)
{
    kvg_model_load_opts o = { 0 };
    o.tokenizer_path = tok;
    err[0] = '\0';
    return kvg_model_load(path, &o, err, err_len);
}

/* Loading must fail with a message containing every fragment. */
static void expect_fail(const char *path, const char *tok, int max_seq, const char *label, const char *frag1,
                        const char *frag2)
{
    char err[1024];
    kvg_model_load_opts o = { 0 };
    o.tokenizer_path = tok;
    o.max_seq_len = max_seq;
    err[0] = '\0';
    kvg_model *m = kvg_model_load(path, &o, err, sizeof err);
    int good = !m && strstr(err, frag1) && (!frag2 || strstr(err, frag2));
    if (!ok(good, "%s: fails naming '%s'%s%s", label, frag1, frag2 ? " and " : "", frag2 ? frag2 : ""))
        diag("  got: %s", m ? "(loaded)" : err);
    kvg_model_free(m);
}

static float file_f32(const unsigned char *file, size_t float_index)
{
    float f;
    memcpy(&f, file + 28 + 4 * float_index, 4);
    return f;
}

/* ---- llama2.c ---- */

static void test_llama2c(void)
{
    char err[512];
    size_t flen;
    unsigned char *file = (unsigned char *)slurp(model_path, &flen);
    kvg_model *m = load(model_path, tok_path, err, sizeof err);
    if (!ok(m != NULL && file != NULL, "stories260K.bin loads")) {
        diag("%s", err);
        free(file);
        return;
    }
    const kvg_model_config *c = &m->cfg;
    ok(c->dim == 64 && c->hidden_dim == 172 && c->n_layers == 5 && c->n_heads == 8 && c->n_kv_heads == 4
       && c->head_dim == 8 && c->vocab_size == 512 && c->max_seq_len == 512, "config from the header");
    ok(c->tied_embeddings && m->output.data == m->tok_embedding.data, "positive vocab_size: tied classifier");
    ok(c->norm_eps == 1e-5f && c->rope_theta == 10000.0f && c->rope_layout == KVG_ROPE_ADJACENT
       && !c->has_qkv_bias && c->rope_scale_factor == 0, "llama2.c constants");
    is_str(c->arch, "llama", "arch llama");
    is_str(m->name, "stories260K", "name from the file");
    is_str(m->format, "llama2c", "format llama2c");
    ok(m->tokenizer && m->bos == 1 && m->eos == 2, "tokenizer loaded, bos 1, eos 2");
    is_int(strlen(m->id_hex), 64, "64 hex digits of identity");
    ok(m->tok_embedding.dtype == KVG_DT_F32 && m->layers[0].wq.dtype == KVG_DT_F32, "F32 tensors");

    /* Spot checks against the file's bytes (offsets in floats after the 28-byte header). */
    size_t D = 64, H = 172, KV = 32, V = 512, L = 5;
    size_t emb = 0, att = emb + V * D, wq = att + L * D, wk = wq + L * D * D, wv = wk + L * KV * D,
           wo = wv + L * KV * D, ffn = wo + L * D * D, w1 = ffn + L * D, w2 = w1 + L * H * D, w3 = w2 + L * D * H,
           fin = w3 + L * H * D;
    ok(fin + D + 2 * 512 * 4 == (flen - 28) / 4, "file size matches the layout (+ freq_cis tables)");
    const float *e = m->tok_embedding.data;
    ok(e[7 * D + 3] == file_f32(file, emb + 7 * D + 3), "token_embedding[7][3]");
    ok(m->layers[3].attn_norm[5] == file_f32(file, att + 3 * D + 5), "rms_att[3][5]");
    ok(((const float *)m->layers[2].wq.data)[5 * D + 9] == file_f32(file, wq + 2 * D * D + 5 * D + 9), "wq[2][5][9]");
    ok(((const float *)m->layers[4].wk.data)[31 * D + 63] == file_f32(file, wk + 4 * KV * D + 31 * D + 63),
       "wk[4][31][63]");
    ok(((const float *)m->layers[1].wv.data)[0] == file_f32(file, wv + KV * D), "wv[1][0][0]");
    ok(((const float *)m->layers[0].wo.data)[D * D - 1] == file_f32(file, wo + D * D - 1), "wo[0][63][63]");
    ok(m->layers[4].ffn_norm[63] == file_f32(file, ffn + 4 * D + 63), "rms_ffn[4][63]");
    ok(((const float *)m->layers[1].w_gate.data)[10 * D + 7] == file_f32(file, w1 + H * D + 10 * D + 7),
       "w1[1][10][7]");
    ok(((const float *)m->layers[1].w_down.data)[10 * H + 171] == file_f32(file, w2 + D * H + 10 * H + 171),
       "w2[1][10][171]");
    ok(((const float *)m->layers[4].w_up.data)[171 * D] == file_f32(file, w3 + 4 * H * D + 171 * D), "w3[4][171][0]");
    ok(m->final_norm[5] == file_f32(file, fin + 5), "rms_final[5]");
    ok(m->layers[0].wq.data == (const void *)(((const unsigned char *)m->tok_embedding.data) + 4 * wq),
       "matrices point into the mapping (no copy)");

    float row[172];
    kvg_tensor_row_f32(&m->layers[1].w_down, 10, row);
    ok(row[171] == file_f32(file, w2 + D * H + 10 * H + 171), "kvg_tensor_row_f32 on F32");

    kvg_model *m2 = load(model_path, tok_path, err, sizeof err);
    ok(m2 && memcmp(m2->id, m->id, 32) == 0, "same files, same identity");
    kvg_model_free(m2);

    kvg_model_load_opts o = { 0 };
    o.tokenizer_path = tok_path;
    o.max_seq_len = 100;
    m2 = kvg_model_load(model_path, &o, err, sizeof err);
    ok(m2 && m2->cfg.max_seq_len == 100, "max_seq_len option shortens the context");
    kvg_model_free(m2);
    free(file);
    kvg_model_free(m);
}

static void test_identity(void)
{
    char err[512], p[512], tp[512];
    size_t n, tn;
    unsigned char *b = (unsigned char *)slurp(model_path, &n);
    unsigned char *tb = (unsigned char *)slurp(tok_path, &tn);
    kvg_model *ref = load(model_path, tok_path, err, sizeof err);
    tmp(p, sizeof p, "flip.bin");
    tmp(tp, sizeof tp, "flip-tok.bin");
    b[28 + 4 * 1000 + 1] ^= 1;                      /* one byte of one embedding weight */
    write_bytes(p, b, n);
    kvg_model *m = load(p, tok_path, err, sizeof err);
    ok(ref && m && memcmp(m->id, ref->id, 32) != 0, "one weight byte changed: identity changes");
    kvg_model_free(m);
    b[28 + 4 * 1000 + 1] ^= 1;
    write_bytes(p, b, n);
    m = load(p, tok_path, err, sizeof err);
    ok(ref && m && memcmp(m->id, ref->id, 32) == 0, "restored: identity back (path does not matter)");
    kvg_model_free(m);
    tb[4] ^= 0x40;                                  /* the score of <unk> */
    write_bytes(tp, tb, tn);
    m = load(model_path, tp, err, sizeof err);
    ok(ref && m && memcmp(m->id, ref->id, 32) != 0, "one tokenizer byte changed: identity changes");
    kvg_model_free(m);
    kvg_model_free(ref);
    free(b);
    free(tb);
}

typedef struct prog {
    int calls;
    uint64_t last_done, total;
    int monotonic;
} prog;

static void on_progress(void *ctx, const char *what, uint64_t done, uint64_t total)
{
    prog *p = ctx;
    if (done < p->last_done || strcmp(what, "hashing") != 0)
        p->monotonic = 0;
    p->calls++;
    p->last_done = done;
    p->total = total;
}

static void test_progress(void)
{
    char err[512];
    prog p = { 0, 0, 0, 1 };
    kvg_model_load_opts o = { 0 };
    o.tokenizer_path = tok_path;
    o.progress = on_progress;
    o.progress_ctx = &p;
    kvg_model *m = kvg_model_load(model_path, &o, err, sizeof err);
    ok(m && p.calls >= 1 && p.monotonic && p.last_done == p.total && p.total == 1056540 + 6227,
       "progress reported, ending at done == total (weights + tokenizer bytes)");
    kvg_model_free(m);
}

static void test_llama2c_errors(void)
{
    char p[512];
    size_t n;
    unsigned char *b = (unsigned char *)slurp(model_path, &n);

    expect_fail(model_path, NULL, 0, "no tokenizer", "tokenizer_path", "stories260K.bin");
    tmp(p, sizeof p, "missing.bin");
    expect_fail(p, tok_path, 0, "missing file", "missing.bin", "cannot open");
    expect_fail(model_path, p, 0, "missing tokenizer file", "missing.bin", "cannot open");
    expect_fail(model_path, tok_path, 4096, "max_seq_len beyond the model", "exceeds", "512");

    tmp(p, sizeof p, "trunc.bin");
    write_bytes(p, b, 28 + 4 * (512 * 64 + 5 * 64 + 100));
    expect_fail(p, tok_path, 0, "truncated checkpoint", "truncated", "tensor wq");
    write_bytes(p, b, 10);
    expect_fail(p, tok_path, 0, "10-byte file", "too short", "trunc.bin");
    unsigned char *big = malloc(n + 8);
    memcpy(big, b, n);
    memset(big + n, 0, 8);
    write_bytes(p, big, n + 8);
    expect_fail(p, tok_path, 0, "trailing bytes", "has 1056548 bytes", "implies 1056540");
    free(big);

    int32_t h[7];
    memcpy(h, b, 28);
    h[3] = 7;                                       /* 64 % 7 != 0 */
    memcpy(b, h, 28);
    write_bytes(p, b, n);
    expect_fail(p, tok_path, 0, "inconsistent heads", "inconsistent heads", "trunc.bin");
    h[3] = 8;
    h[0] = -5;
    memcpy(b, h, 28);
    write_bytes(p, b, n);
    expect_fail(p, tok_path, 0, "garbage header", "not a llama2.c checkpoint", "dim -5");
    h[0] = 64;
    memcpy(b, h, 28);

    uint32_t v2[2] = { 0x616b3432, 2 };
    memcpy(b, v2, 8);
    write_bytes(p, b, n);
    expect_fail(p, tok_path, 0, "ak42 version 2", "version 2", "int8");
    v2[1] = 9;
    memcpy(b, v2, 8);
    write_bytes(p, b, n);
    expect_fail(p, tok_path, 0, "ak42 version 9", "unknown llama2.c checkpoint version 9", NULL);
    tmp(p, sizeof p, "empty.bin");
    write_bytes(p, "", 0);
    expect_fail(p, tok_path, 0, "empty file", "empty file", "empty.bin");
    expect_fail(model_path, p, 0, "empty tokenizer file", "empty file", "empty.bin");
    expect_fail(tmpdir, NULL, 0, "directory without config.json", "config.json", tmpdir);
    expect_fail("", NULL, 0, "empty path", "no model path", NULL);
    free(b);
}

static void test_v1(void)
{
    char err[512], p[512];
    kvg_model *ref = load(model_path, tok_path, err, sizeof err);
    if (!ref)
        return;
    tmp(p, sizeof p, "v1.bin");
    ok(mw_write_llama2c_v1(ref, p, err, sizeof err) == 0, "ak42 version 1 file written");
    kvg_model *m = load(p, tok_path, err, sizeof err);
    if (ok(m != NULL, "version 1 loads")) {
        ok(memcmp(&m->cfg, &ref->cfg, sizeof m->cfg) == 0, "same config");
        ok(mw_max_diff(m, ref) == 0, "every weight identical");
        ok(m->cfg.tied_embeddings, "shared_classifier flag read");
    } else {
        diag("%s", err);
    }
    kvg_model_free(m);

    /* Untied: the same weights with the classifier stored separately. */
    ref->cfg.tied_embeddings = 0;
    tmp(p, sizeof p, "v1-untied.bin");
    mw_write_llama2c_v1(ref, p, err, sizeof err);
    m = load(p, tok_path, err, sizeof err);
    ok(m && !m->cfg.tied_embeddings && m->output.data != m->tok_embedding.data && mw_max_diff(m, ref) == 0,
       "version 1 with its own classifier");
    kvg_model_free(m);

    size_t n;
    unsigned char *b = (unsigned char *)slurp(p, &n);
    write_bytes(p, b, n - 4);
    expect_fail(p, tok_path, 0, "truncated v1", "truncated", "wcls");
    write_bytes(p, b, 100);
    expect_fail(p, tok_path, 0, "v1 shorter than its header", "header alone", NULL);
    free(b);
    kvg_model_free(ref);
}

static void test_export(void)
{
    char err[512], p[512];
    kvg_model *ref = load(model_path, tok_path, err, sizeof err);
    tmp(p, sizeof p, "export.bin");
    ok(ref && kvg_model_export_llama2c(ref, p, err, sizeof err) == 0, "stories260K exported");
    kvg_model *m = load(p, tok_path, err, sizeof err);
    ok(m && mw_max_diff(m, ref) == 0 && memcmp(&m->cfg, &ref->cfg, sizeof m->cfg) == 0,
       "export round trip: same config and weights");
    struct stat st;
    ok(stat(p, &st) == 0 && st.st_size == 1056540, "same size as the original (freq_cis tables included)");
    kvg_model_free(m);

    kvg_model *s = load("synthetic:260K", NULL, err, sizeof err);
    ok(s && kvg_model_export_llama2c(s, p, err, sizeof err) == 0, "synthetic:260K exported");
    m = load(p, tok_path, err, sizeof err);
    ok(m && s && mw_max_diff(m, s) == 0 && m->cfg.vocab_size == 512 && m->cfg.tied_embeddings,
       "synthetic export round trip");
    kvg_model_free(m);
    if (s) {
        s->cfg.tied_embeddings = 0;             /* same arrays written as a separate classifier */
        kvg_model_export_llama2c(s, p, err, sizeof err);
        FILE *f = fopen(p, "rb");
        int32_t h[7] = { 0 };
        if (f) {
            if (fread(h, 4, 7, f) != 7)
                h[5] = 0;
            fclose(f);
        }
        is_int(h[5], -512, "untied export writes a negative vocab_size");
        m = load(p, tok_path, err, sizeof err);
        ok(m && !m->cfg.tied_embeddings && mw_max_diff(m, s) == 0, "untied export round trip");
        kvg_model_free(m);
        s->cfg.rope_theta = 500000.0f;
        ok(kvg_model_export_llama2c(s, p, err, sizeof err) < 0 && strstr(err, "rope_theta"),
           "export refuses what the format cannot express (rope_theta)");
        tmp(p, sizeof p, "no-such-dir/x.bin");
        s->cfg.rope_theta = 10000.0f;
        ok(kvg_model_export_llama2c(s, p, err, sizeof err) < 0 && strstr(err, "cannot create"),
           "export to an unwritable path fails");
    }
    kvg_model_free(s);
    kvg_model_free(ref);
}

/* ---- synthetic ---- */

static void test_synthetic(void)
{
    char err[512];
    kvg_model *a = load("synthetic:260K", NULL, err, sizeof err);
    kvg_model *b = load("synthetic:260K", NULL, err, sizeof err);
    if (!ok(a && b, "synthetic:260K loads twice")) {
        diag("%s", err);
        kvg_model_free(a);
        kvg_model_free(b);
        return;
    }
    ok(a->cfg.dim == 64 && a->cfg.hidden_dim == 172 && a->cfg.n_layers == 5 && a->cfg.n_heads == 8
       && a->cfg.n_kv_heads == 4 && a->cfg.vocab_size == 512 && a->cfg.max_seq_len == 512, "260K shape");
    is_str(a->format, "synthetic", "format synthetic");
    is_str(a->name, "synthetic:260K", "name synthetic:260K");
    ok(memcmp(a->id, b->id, 32) == 0 && mw_max_diff(a, b) == 0, "same seed: same weights, same identity");

    kvg_model *c = load("synthetic:260K-seed7", NULL, err, sizeof err);
    ok(c && memcmp(a->id, c->id, 32) != 0 && mw_max_diff(a, c) > 0, "another seed: other weights and identity");
    kvg_model_free(c);

    /* Weights look like a fresh model: uniform in +-1/sqrt(fan_in), norms 1. */
    const kvg_tensor *w = &a->layers[2].w_down;     /* fan_in 172 */
    float bound = 1.0f / sqrtf(172.0f), mx = 0;
    double sum = 0, sq = 0;
    size_t n = (size_t)(w->rows * w->cols);
    for (size_t i = 0; i < n; i++) {
        float v = ((const float *)w->data)[i];
        mx = fabsf(v) > mx ? fabsf(v) : mx;
        sum += v;
        sq += (double)v * v;
    }
    double sd = sqrt(sq / (double)n), want = bound / sqrt(3.0);
    ok(mx < bound && mx > 0.99f * bound, "w_down within +-1/sqrt(172) and filling it (max %g)", mx);
    ok(fabs(sum / (double)n) < 0.05 * want && fabs(sd - want) < 0.05 * want, "mean ~0 and std ~%g (got %g)", want,
       sd);
    ok(a->layers[0].attn_norm[0] == 1.0f && a->final_norm[63] == 1.0f, "norms are 1");

    /* Byte-level tokenizer: text becomes byte pieces, fillers never appear. */
    int32_t *ids = NULL;
    size_t ni = 0;
    const char *text = "h\xc3\xa9 <unused_5>";
    int rc = kvg_tokenizer_encode(a->tokenizer, text, strlen(text), 0, &ids, &ni, err, sizeof err);
    int bytes_only = rc == 0 && ni > 0;
    for (size_t i = 0; bytes_only && i < ni; i++)
        bytes_only = ids[i] >= 3 && ids[i] < 259;
    ok(bytes_only, "encoding yields only byte pieces (ids 3..258)");
    char *out = NULL;
    size_t ol = 0;
    ok(rc == 0 && kvg_tokenizer_decode(a->tokenizer, ids, ni, &out, &ol, err, sizeof err) == 0 && out
       && strstr(out, text), "decode gives the text back");
    free(out);
    free(ids);
    ok(a->bos == 1 && a->eos == 2 && kvg_tokenizer_vocab_size(a->tokenizer) == 512, "bos 1, eos 2, 512 pieces");

    /* BF16 weights are the BF16 rounding of the F32 ones. */
    kvg_model *h = load("synthetic:260K-bf16", NULL, err, sizeof err);
    int same = h && h->layers[1].wk.dtype == KVG_DT_BF16;
    for (int64_t i = 0; same && i < h->layers[1].wk.rows * h->layers[1].wk.cols; i++) {
        uint16_t x = ((const uint16_t *)h->layers[1].wk.data)[i];
        same = x == mw_f32_to_bf16(((const float *)a->layers[1].wk.data)[i]);
    }
    ok(same, "-bf16: BF16 rounding of the F32 weights");
    ok(h && memcmp(h->id, a->id, 32) != 0, "-bf16: its own identity");
    kvg_model_free(h);

    kvg_model_load_opts o = { 0 };
    o.max_seq_len = 4096;
    kvg_model *big = kvg_model_load("synthetic:15M", &o, err, sizeof err);
    ok(big && big->cfg.dim == 288 && big->cfg.hidden_dim == 768 && big->cfg.n_layers == 6 && big->cfg.n_heads == 6
       && big->cfg.n_kv_heads == 6 && big->cfg.vocab_size == 32000 && big->cfg.max_seq_len == 4096,
       "synthetic:15M shape, context extended to 4096 by the option");
    kvg_model_free(big);

    o.max_seq_len = 0;
    o.tokenizer_path = tok_path;
    kvg_model *t = kvg_model_load("synthetic:260K", &o, err, sizeof err);
    ok(t && strcmp(kvg_tokenizer_kind(t->tokenizer), "llama2c") == 0 && memcmp(t->id, a->id, 32) != 0
       && mw_max_diff(t, a) == 0, "tokenizer_path replaces the byte tokenizer (and the identity)");
    kvg_model_free(t);
    char lp[512];
    snprintf(lp, sizeof lp, "%s/tokenizers/llama2/tokenizer.bin", shared_dir());
    expect_fail("synthetic:260K", lp, 0, "tokenizer larger than the vocabulary", "32000 tokens", "512");

    expect_fail("synthetic:3B", NULL, 0, "unknown preset", "unknown synthetic model", "260K, 15M, 110M, 1B, 8B4L");
    expect_fail("synthetic:15M-fp8", NULL, 0, "unknown option", "unknown synthetic option \"fp8\"", NULL);
    kvg_model_free(a);
    kvg_model_free(b);
}

/* ---- GGUF ---- */

/* Every element of b equals a's element rounded by `round` (via F16 or BF16). */
static int all_rounded(const kvg_model *a, const kvg_model *b, kvg_dtype dt)
{
    mw_tensor *la, *lb;
    int n = mw_list(a, &la), good = mw_list(b, &lb) == n;
    for (int i = 0; good && i < n; i++) {
        if (!la[i].t)
            continue;
        int64_t rows = la[i].t->rows, cols = la[i].t->cols;
        float *ra = malloc((size_t)cols * 4), *rb = malloc((size_t)cols * 4);
        for (int64_t r = 0; good && r < rows; r++) {
            mw_row_adjacent(a, la[i].t, la[i].is_qk, r, ra);
            mw_row_adjacent(b, lb[i].t, lb[i].is_qk, r, rb);
            for (int64_t k = 0; good && k < cols; k++) {
                float want = dt == KVG_DT_F16 ? mw_f16_to_f32(mw_f32_to_f16(ra[k]))
                                              : mw_bf16_to_f32(mw_f32_to_bf16(ra[k]));
                good = rb[k] == want;
                if (!good)
                    diag("%s row %lld col %lld: %.9g, expected %.9g", la[i].gguf, (long long)r, (long long)k, rb[k],
                         want);
            }
        }
        free(ra);
        free(rb);
    }
    free(la);
    free(lb);
    return good;
}

/* The same ids for a few prompts through both tokenizers. */
static int same_encoding(const kvg_tokenizer *x, const kvg_tokenizer *y)
{
    static const char *texts[] = { "Once upon a time", "Hello, world! 123", "  two  spaces\nnew line",
                                   "caf\xc3\xa9 \xe2\x82\xac 5", "Lily and Tim played in the park." };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        char err[256];
        int ra = kvg_tokenizer_encode(x, texts[i], strlen(texts[i]), KVG_ENC_BOS, &a, &na, err, sizeof err);
        int rb = kvg_tokenizer_encode(y, texts[i], strlen(texts[i]), KVG_ENC_BOS, &b, &nb, err, sizeof err);
        int same = ra == 0 && rb == 0 && na == nb && memcmp(a, b, na * sizeof *a) == 0;
        if (!same)
            diag("encodings differ for \"%s\" (%zu vs %zu ids)", texts[i], na, nb);
        free(a);
        free(b);
        if (!same)
            return 0;
    }
    return 1;
}

/* Overwrites the first occurrence of `find` in the file with `repl` (same length). */
static int patch(const char *path, const char *find, const char *repl)
{
    size_t n;
    char *b = slurp(path, &n);
    char *at = b ? memmem(b, n, find, strlen(find)) : NULL;
    if (at)
        memcpy(at, repl, strlen(repl));
    int rc = at ? write_bytes(path, b, n) : -1;
    free(b);
    return rc;
}

/* Sets the u32 value of GGUF key `key` (its type tag follows the key string). */
static int patch_gguf_u32(const char *path, const char *key, uint32_t v)
{
    size_t n;
    char *b = slurp(path, &n);
    char *at = b ? memmem(b, n, key, strlen(key)) : NULL;
    if (at)
        memcpy(at + strlen(key) + 4, &v, 4);
    int rc = at ? write_bytes(path, b, n) : -1;
    free(b);
    return rc;
}

/* Sets (or with NULL removes) a top-level key of a JSON file. */
static void edit_json(const char *path, const char *key, json_t *value)
{
    json_t *j = json_load_file(path, 0, NULL);
    if (!j) {
        json_decref(value);
        return;
    }
    if (value)
        json_object_set_new(j, key, value);
    else
        json_object_del(j, key);
    json_dump_file(j, path, JSON_INDENT(1));
    json_decref(j);
}

static void test_gguf(void)
{
    static const kvg_dtype dts[] = { KVG_DT_F32, KVG_DT_F16, KVG_DT_BF16 };
    char err[512], p[512];
    kvg_model *ref = load(model_path, tok_path, err, sizeof err);
    if (!ref)
        return;
    for (int i = 0; i < 3; i++) {
        mw_opts o = { 0 };
        o.dtype = dts[i];
        o.tok_path = tok_path;
        o.chat_template = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}";
        snprintf(p, sizeof p, "%s/stories-%s.gguf", tmpdir, kvg_dtype_name(dts[i]));
        ok(mw_write_gguf(ref, p, &o, err, sizeof err) == 0, "GGUF %s written", kvg_dtype_name(dts[i]));
        kvg_model *m = load(p, NULL, err, sizeof err);
        if (!ok(m != NULL, "GGUF %s loads", kvg_dtype_name(dts[i]))) {
            diag("%s", err);
            continue;
        }
        ok(memcmp(&m->cfg, &ref->cfg, sizeof m->cfg) == 0, "GGUF %s: same config", kvg_dtype_name(dts[i]));
        ok(m->layers[2].w_up.dtype == dts[i] && m->tok_embedding.dtype == dts[i], "GGUF %s: matrices keep dtype %s",
           kvg_dtype_name(dts[i]), kvg_dtype_name(dts[i]));
        if (dts[i] == KVG_DT_F32)
            ok(mw_max_diff(m, ref) == 0, "GGUF F32: every weight identical");
        else
            ok(all_rounded(ref, m, dts[i]) && mw_max_diff(m, ref) < 0.01, "GGUF %s: every weight is the rounded "
               "original", kvg_dtype_name(dts[i]));
        ok(m->final_norm && m->layers[4].ffn_norm[3] == ref->layers[4].ffn_norm[3], "GGUF %s: norms",
           kvg_dtype_name(dts[i]));
        is_str(m->format, "gguf", "GGUF %s: format", kvg_dtype_name(dts[i]));
        ok(m->chat_template && strcmp(m->chat_template, o.chat_template) == 0, "GGUF %s: chat template",
           kvg_dtype_name(dts[i]));
        ok(m->tokenizer && m->bos == 1 && m->eos == 2 && same_encoding(m->tokenizer, ref->tokenizer),
           "GGUF %s: embedded tokenizer encodes like tok512.bin", kvg_dtype_name(dts[i]));
        kvg_model_free(m);
    }
    snprintf(p, sizeof p, "%s/stories-F32.gguf", tmpdir);
    kvg_model *m = load(p, NULL, err, sizeof err);
    is_str(m ? m->name : NULL, "stories-F32", "GGUF name from the file");
    kvg_model_free(m);

    /* Untied output. */
    ref->cfg.tied_embeddings = 0;
    mw_opts o = { 0 };
    o.tok_path = tok_path;
    tmp(p, sizeof p, "untied.gguf");
    mw_write_gguf(ref, p, &o, err, sizeof err);
    m = load(p, NULL, err, sizeof err);
    ok(m && !m->cfg.tied_embeddings && m->output.data != m->tok_embedding.data && mw_max_diff(m, ref) == 0,
       "GGUF with output.weight: untied");
    ref->cfg.tied_embeddings = 1;
    kvg_model_free(m);

    /* Errors. */
    char q[512];
    tmp(q, sizeof q, "bad.gguf");
    size_t n;
    char *good;
    snprintf(p, sizeof p, "%s/stories-F32.gguf", tmpdir);
    good = slurp(p, &n);

    write_bytes(q, good, n);
    patch(q, "blk.1.ffn_up.weight", "blk.1.ffn_uX.weight");
    expect_fail(q, NULL, 0, "GGUF missing tensor", "missing tensor blk.1.ffn_up.weight", "bad.gguf");

    write_bytes(q, good, n);
    patch(q, "llama", "llamX");
    expect_fail(q, NULL, 0, "GGUF unknown architecture", "unknown architecture \"llamX\"", "bad.gguf");

    write_bytes(q, good, n);
    patch_gguf_u32(q, "llama.feed_forward_length", 100);
    expect_fail(q, NULL, 0, "GGUF shape mismatch", "tensor blk.0.ffn_gate.weight has shape [172][64]", "[100][64]");

    write_bytes(q, good, n);
    patch_gguf_u32(q, "llama.embedding_length", 0);
    expect_fail(q, NULL, 0, "GGUF zero embedding_length", "llama.embedding_length is not a positive integer", NULL);

    write_bytes(q, good, n / 2);
    expect_fail(q, NULL, 0, "GGUF truncated", "truncated", "bad.gguf");

    /* A Q8_0 matrix (34 bytes per 32 values) in an otherwise valid file. */
    {
        gb b;
        gb_init(&b, 3, 1, 1);
        gb_key(&b, "general.architecture", 8), gb_str(&b, "llama");
        gb_str(&b, "token_embd.weight"), gb_u32(&b, 2), gb_u64(&b, 64), gb_u64(&b, 4), gb_u32(&b, 8), gb_u64(&b, 0);
        gb_pad(&b, 32);
        for (int i = 0; i < 4 * 2 * 34; i++)
            gb_u8(&b, 0);
        write_bytes(q, b.p, b.n);
        gb_free(&b);
    }
    expect_fail(q, NULL, 0, "GGUF without hyperparameters", "missing key llama.embedding_length", NULL);
    {
        mw_opts oq = { 0 };
        oq.tok_path = tok_path;
        mw_write_gguf(ref, q, &oq, err, sizeof err);
        /* Retag blk.0.attn_q.weight (64x64 F32 = 16 KiB) as Q5_1, a block format the engine does not run (64x64 -> 3072 bytes): still in bounds. */
        size_t qn;
        char *qb = slurp(q, &qn);
        char *at = qb ? memmem(qb, qn, "blk.0.attn_q.weight", 19) : NULL;
        if (at) {
            uint32_t t8 = 7;
            memcpy(at + 19 + 4 + 16, &t8, 4);   /* name, n_dims, ne[0], ne[1], then the type */
            write_bytes(q, qb, qn);
        }
        free(qb);
    }
    expect_fail(q, NULL, 0, "GGUF unsupported dtype", "unsupported dtype Q5_1 for tensor blk.0.attn_q.weight",
                "bad.gguf");
    {
        mw_opts on = { 0 };
        mw_write_gguf(ref, q, &on, err, sizeof err);       /* no tokenizer inside */
    }
    expect_fail(q, NULL, 0, "GGUF without tokenizer", "no tokenizer", "tokenizer_path");
    m = load(q, tok_path, err, sizeof err);
    ok(m && mw_max_diff(m, ref) == 0, "GGUF without tokenizer loads with tokenizer_path");
    kvg_model_free(m);
    free(good);
    kvg_model_free(ref);
}

/* ---- Hugging Face ---- */

static void test_hf(void)
{
    char err[512], d[512], p[1024];
    kvg_model *ref = load(model_path, tok_path, err, sizeof err);
    if (!ref)
        return;
    struct { kvg_dtype dt; int shards, misalign; const char *name; } v[] = {
        { KVG_DT_F32, 1, 0, "hf-f32" }, { KVG_DT_BF16, 3, 0, "hf-bf16-sharded" }, { KVG_DT_F16, 1, 1, "hf-f16-misaligned" },
        { KVG_DT_F32, 2, 1, "hf-f32-sharded-misaligned" },
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        mw_opts o = { 0 };
        o.dtype = v[i].dt;
        o.n_shards = v[i].shards;
        o.misalign = v[i].misalign;
        o.tok_path = tok_path;
        o.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}";
        tmp(d, sizeof d, v[i].name);
        ok(mw_write_hf(ref, d, &o, err, sizeof err) == 0, "%s written", v[i].name);
        kvg_model *m = load(d, NULL, err, sizeof err);
        if (!ok(m != NULL, "%s loads", v[i].name)) {
            diag("%s", err);
            continue;
        }
        kvg_model_config want = ref->cfg;
        want.rope_layout = KVG_ROPE_HALF;
        ok(memcmp(&m->cfg, &want, sizeof want) == 0, "%s: config (rope layout rotate-half)", v[i].name);
        ok(strcmp(m->name, v[i].name) == 0, "%s: name from the directory (%s)", v[i].name, m->name);
        is_str(m->format, "hf", "%s: format hf", v[i].name);
        if (v[i].dt == KVG_DT_F32)
            ok(mw_max_diff(m, ref) == 0, "%s: un-permuted Q/K and every other weight identical", v[i].name);
        else
            ok(all_rounded(ref, m, v[i].dt), "%s: every weight is the rounded original", v[i].name);
        /* Q/K as stored: HF row j < hd/2 of head h is llama2.c row 2j, row hd/2 + j is 2j + 1. */
        float a[64], b[64];
        kvg_tensor_row_f32(&m->layers[2].wq, 3 * 8 + 1, a);
        kvg_tensor_row_f32(&ref->layers[2].wq, 3 * 8 + 2, b);
        float a2[64], b2[64];
        kvg_tensor_row_f32(&m->layers[4].wk, 1 * 8 + 4 + 3, a2);
        kvg_tensor_row_f32(&ref->layers[4].wk, 1 * 8 + 7, b2);
        if (v[i].dt == KVG_DT_F32)
            ok(memcmp(a, b, sizeof a) == 0 && memcmp(a2, b2, sizeof a2) == 0,
               "%s: Q/K rows in rotate-half order, not permuted at load", v[i].name);
        int aligned = ((uintptr_t)m->layers[0].wq.data & (kvg_dtype_size(v[i].dt) - 1)) == 0;
        ok(aligned, "%s: tensor data aligned for its dtype%s", v[i].name, v[i].misalign ? " (copied)" : "");
        ok(m->chat_template && strcmp(m->chat_template, o.chat_template) == 0, "%s: chat template from "
           "tokenizer_config.json", v[i].name);
        ok(m->tokenizer && strcmp(kvg_tokenizer_kind(m->tokenizer), "hf-spm") == 0
           && same_encoding(m->tokenizer, ref->tokenizer), "%s: tokenizer.json encodes like tok512.bin",
           v[i].name);
        kvg_model_free(m);
    }

    /* tokenizer_path instead of tokenizer.json; no chat template. */
    mw_opts o = { 0 };
    tmp(d, sizeof d, "hf-notok");
    mw_write_hf(ref, d, &o, err, sizeof err);
    expect_fail(d, NULL, 0, "HF without tokenizer.json", "no tokenizer.json", "tokenizer_path");
    kvg_model *m = load(d, tok_path, err, sizeof err);
    ok(m && mw_max_diff(m, ref) == 0 && !m->chat_template && strcmp(kvg_tokenizer_kind(m->tokenizer), "llama2c") == 0,
       "HF with tokenizer_path: loads, tokenizer from the option");
    kvg_model_free(m);

    /* Untied with lm_head.weight. */
    ref->cfg.tied_embeddings = 0;
    tmp(d, sizeof d, "hf-untied");
    mw_write_hf(ref, d, &o, err, sizeof err);
    m = load(d, tok_path, err, sizeof err);
    ok(m && !m->cfg.tied_embeddings && m->output.data != m->tok_embedding.data && mw_max_diff(m, ref) == 0,
       "HF untied: lm_head.weight");
    ref->cfg.tied_embeddings = 1;
    kvg_model_free(m);

    /* Errors, each on a fresh copy of a good directory. */
    tmp(d, sizeof d, "hf-bad");
#define FRESH(sh) (rm_rf(d), o.n_shards = (sh), mw_write_hf(ref, d, &o, err, sizeof err))
    FRESH(1);
    snprintf(p, sizeof p, "%s/config.json", d);
    edit_json(p, "model_type", json_string("gpt-2"));
    expect_fail(d, tok_path, 0, "HF unknown architecture", "unknown architecture \"gpt-2\"", "config.json");

    FRESH(1);
    edit_json(p, "intermediate_size", json_integer(100));
    expect_fail(d, tok_path, 0, "HF shape mismatch", "tensor model.layers.0.mlp.gate_proj.weight has shape [172, 64]",
                "model.safetensors");

    FRESH(1);
    edit_json(p, "tie_word_embeddings", json_false());
    expect_fail(d, tok_path, 0, "HF untied without lm_head", "missing tensor lm_head.weight", "model.safetensors");

    FRESH(1);
    edit_json(p, "hidden_size", NULL);
    expect_fail(d, tok_path, 0, "HF config without hidden_size", "missing hidden_size", "config.json");

    FRESH(1);
    edit_json(p, "rope_scaling", json_pack("{s:s, s:f}", "rope_type", "yarn", "factor", 4.0));
    expect_fail(d, tok_path, 0, "HF yarn rope scaling", "rope_scaling type \"yarn\" is not supported", "config.json");

    FRESH(1);
    edit_json(p, "attention_bias", json_true());
    expect_fail(d, tok_path, 0, "HF llama attention_bias", "attention_bias", "config.json");

    FRESH(1);
    edit_json(p, "num_key_value_heads", json_integer(3));
    expect_fail(d, tok_path, 0, "HF heads not divisible", "8 attention, 3 key/value", "config.json");

    FRESH(1);
    snprintf(p, sizeof p, "%s/config.json", d);
    write_bytes(p, "{\"model_type\": ", 15);
    expect_fail(d, tok_path, 0, "HF bad config.json", "bad JSON", "config.json");

    FRESH(1);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    patch(p, "\"F32\"", "\"I32\"");
    expect_fail(d, tok_path, 0, "HF unsupported dtype", "unsupported dtype I32 for tensor", "model.safetensors");

    FRESH(1);
    {
        size_t n;
        char *b = slurp(p, &n);
        write_bytes(p, b, n - 100);
        free(b);
    }
    expect_fail(d, tok_path, 0, "HF truncated safetensors", "truncated safetensors file: tensor", "model.safetensors");

    FRESH(1);
    {
        size_t n;
        char *b = slurp(p, &n);
        uint64_t huge = (uint64_t)1 << 40;
        memcpy(b, &huge, 8);
        write_bytes(p, b, n);
        free(b);
    }
    expect_fail(d, tok_path, 0, "HF bad header length", "bad safetensors header length", "model.safetensors");

    FRESH(1);
    patch(p, "\"shape\":[512,64]", "\"shape\":[512,65]");
    expect_fail(d, tok_path, 0, "HF offsets disagree with the shape", "hold 131072 bytes", "need 133120");

    FRESH(1);
    unlink(p);
    expect_fail(d, tok_path, 0, "HF without weights", "no model.safetensors", d);

    FRESH(3);
    snprintf(p, sizeof p, "%s/model-00002-of-00003.safetensors", d);
    unlink(p);
    expect_fail(d, tok_path, 0, "HF missing shard", "model-00002-of-00003.safetensors", "cannot open");

    FRESH(3);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    patch(p, "\"model-00002-of-00003.safetensors\"", "\"../el-00002-of-00003.safetensors\"");
    expect_fail(d, tok_path, 0, "HF index escaping the directory", "not a file name in the directory", NULL);
#undef FRESH
    rm_rf(d);
    kvg_model_free(ref);
}


/* ---- Qwen2 (biases), Llama 3 rope scaling, sliding windows ---- */

static void test_variants(void)
{
    char err[512], d[512], p[1024];
    kvg_model *ref = load(model_path, tok_path, err, sizeof err);
    if (!ref)
        return;
    /* Qwen2: the stories weights plus made-up q/k/v biases. */
    float *bias = malloc(5 * 128 * sizeof(float));
    for (int i = 0; i < 5 * 128; i++)
        bias[i] = (float)i * 0.001f - 0.3f;
    for (int l = 0; l < 5; l++) {
        ref->layers[l].bq = bias + l * 128;
        ref->layers[l].bk = bias + l * 128 + 64;
        ref->layers[l].bv = bias + l * 128 + 96;
    }
    ref->cfg.has_qkv_bias = 1;
    snprintf(ref->cfg.arch, sizeof ref->cfg.arch, "qwen2");
    mw_opts o = { 0 };
    tmp(d, sizeof d, "qwen2-hf");
    mw_write_hf(ref, d, &o, err, sizeof err);
    kvg_model *m = load(d, tok_path, err, sizeof err);
    if (ok(m != NULL, "Qwen2 HF directory loads")) {
        ok(strcmp(m->cfg.arch, "qwen2") == 0 && m->cfg.has_qkv_bias && m->cfg.rope_layout == KVG_ROPE_HALF,
           "Qwen2 HF: arch qwen2, biases, rotate-half");
        ok(mw_max_diff(m, ref) == 0, "Qwen2 HF: weights and (un-permuted) biases identical");
        ok(m->layers[3].bq[2 * 8 + 1] == ref->layers[3].bq[2 * 8 + 2]
           && m->layers[3].bk[1 * 8 + 4 + 2] == ref->layers[3].bk[1 * 8 + 5]
           && m->layers[3].bv[9] == ref->layers[3].bv[9], "Qwen2 HF: q/k biases in rotate-half order, v as is");
        kvg_model_free(m);
    } else {
        diag("%s", err);
    }
    tmp(p, sizeof p, "qwen2.gguf");
    o.tok_path = tok_path;
    mw_write_gguf(ref, p, &o, err, sizeof err);
    m = load(p, NULL, err, sizeof err);
    if (ok(m != NULL, "Qwen2 GGUF loads")) {
        ok(strcmp(m->cfg.arch, "qwen2") == 0 && m->cfg.has_qkv_bias && m->cfg.rope_layout == KVG_ROPE_HALF,
           "Qwen2 GGUF: arch qwen2, biases, rotate-half (llama.cpp's neox rope)");
        ok(mw_max_diff(m, ref) == 0, "Qwen2 GGUF: weights and biases identical");
        kvg_model_free(m);
    } else {
        diag("%s", err);
    }
    ok(kvg_model_export_llama2c(ref, p, err, sizeof err) < 0 && strstr(err, "biases"),
       "export refuses q/k/v biases");
    for (int l = 0; l < 5; l++)
        ref->layers[l].bq = ref->layers[l].bk = ref->layers[l].bv = NULL;
    ref->cfg.has_qkv_bias = 0;
    snprintf(ref->cfg.arch, sizeof ref->cfg.arch, "llama");
    free(bias);

    /* Llama 3 rope scaling. */
    ref->cfg.rope_scale_factor = 8.0f;
    ref->cfg.rope_low_freq_factor = 1.0f;
    ref->cfg.rope_high_freq_factor = 4.0f;
    ref->cfg.rope_orig_max_pos = 8192;
    ref->cfg.rope_theta = 500000.0f;
    tmp(d, sizeof d, "llama3-hf");
    o.tok_path = NULL;
    mw_write_hf(ref, d, &o, err, sizeof err);
    m = load(d, tok_path, err, sizeof err);
    ok(m && m->cfg.rope_scale_factor == 8.0f && m->cfg.rope_low_freq_factor == 1.0f
       && m->cfg.rope_high_freq_factor == 4.0f && m->cfg.rope_orig_max_pos == 8192 && m->cfg.rope_theta == 500000.0f,
       "llama3 rope_scaling and rope_theta read");
    ok(m && kvg_model_export_llama2c(m, p, err, sizeof err) < 0 && strstr(err, "rope scaling"),
       "export refuses rope scaling");
    kvg_model_free(m);
    ref->cfg.rope_scale_factor = ref->cfg.rope_low_freq_factor = ref->cfg.rope_high_freq_factor = 0;
    ref->cfg.rope_orig_max_pos = 0;
    ref->cfg.rope_theta = 10000.0f;

    /* A sliding window shorter than the context bounds the usable context. */
    tmp(d, sizeof d, "mistral-hf");
    mw_write_hf(ref, d, &o, err, sizeof err);
    snprintf(p, sizeof p, "%s/config.json", d);
    edit_json(p, "model_type", json_string("mistral"));
    edit_json(p, "sliding_window", json_integer(100));
    m = load(d, tok_path, err, sizeof err);
    ok(m && m->cfg.max_seq_len == 100 && strcmp(m->cfg.arch, "llama") == 0, "mistral: context = sliding window");
    kvg_model_free(m);
    edit_json(p, "sliding_window", json_null());
    m = load(d, tok_path, err, sizeof err);
    ok(m && m->cfg.max_seq_len == 512, "mistral: null sliding_window keeps the context");
    kvg_model_free(m);
    edit_json(p, "model_type", NULL);
    edit_json(p, "architectures", json_pack("[s]", "MistralForCausalLM"));
    m = load(d, tok_path, err, sizeof err);
    ok(m != NULL, "architecture from architectures[] when model_type is absent");
    kvg_model_free(m);
    kvg_model_free(ref);
}

/* ---- dtype conversions ---- */

static void test_conversions(void)
{
    uint16_t *h = malloc(65536 * 2);
    float *f = malloc(65536 * 4);
    for (int i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    kvg_tensor t = { h, KVG_DT_F16, 1, 65536 };
    kvg_tensor_row_f32(&t, 0, f);
    int bad = 0;
    for (int i = 0; i < 65536; i++) {
        float w = mw_f16_to_f32((uint16_t)i);
        if (isnan(w) ? !isnan(f[i]) : memcmp(&w, &f[i], 4) != 0)
            bad++;
    }
    is_int(bad, 0, "F16 -> F32 exact for all 65536 values (subnormals, infinities, NaN)");
    t.dtype = KVG_DT_BF16;
    kvg_tensor_row_f32(&t, 0, f);
    bad = 0;
    for (int i = 0; i < 65536; i++) {
        uint32_t b;
        memcpy(&b, &f[i], 4);
        bad += b != (uint32_t)i << 16;
    }
    is_int(bad, 0, "BF16 -> F32 exact for all 65536 values");
    ok(strcmp(kvg_dtype_name(KVG_DT_BF16), "BF16") == 0 && kvg_dtype_size(KVG_DT_F16) == 2
       && kvg_dtype_size(KVG_DT_F32) == 4, "dtype names and sizes");

    /* Narrowing: round to nearest even, against the independent writer version. */
    static const float edge[] = { 0.0f, -0.0f, 1.0f, 65504.0f, 65519.99f, 65520.0f, 1e9f, 0x1p-24f, 0x1p-25f,
                                  0x1.8p-25f, 0x1p-14f, 0x1.ffcp-15f, 1.0009765625f, 1.00048828125f,
                                  1.00146484375f, -3.14159f };
    bad = 0;
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        bad += kvg_quant_f32_to_f16(edge[i]) != mw_f32_to_f16(edge[i]);
    uint32_t x = 12345;
    for (int i = 0; i < 200000; i++) {
        x = x * 1664525u + 1013904223u;
        float v;
        uint32_t bits = (x & 0x8fffffffu) | 0x30000000u;      /* magnitudes around 2^-31 .. 2^+32 */
        memcpy(&v, &bits, 4);
        bad += kvg_quant_f32_to_f16(v) != mw_f32_to_f16(v);
        bad += kvgm_f32_to_bf16(v) != mw_f32_to_bf16(v);
        uint16_t r = kvg_quant_f32_to_f16(v);
        if ((r & 0x7c00) != 0x7c00)
            bad += fabsf(kvg_quant_f16_to_f32(r) - v) > fmaxf(fabsf(v) * 0x1p-11f, 0x1p-25f);
    }
    is_int(bad, 0, "F32 -> F16/BF16 round to nearest even (edge cases, 200000 random values)");
    free(h);
    free(f);
}

int main(void)
{
    snprintf(model_path, sizeof model_path, "%s/models/stories260K/stories260K.bin", shared_dir());
    snprintf(tok_path, sizeof tok_path, "%s/models/stories260K/tok512.bin", shared_dir());
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvg-model-load-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        ok(0, "mkdtemp");
        return done_testing();
    }
    test_llama2c();
    test_identity();
    test_progress();
    test_llama2c_errors();
    test_v1();
    test_export();
    test_synthetic();
    test_gguf();
    test_hf();
    test_variants();
    test_conversions();
    rm_rf(tmpdir);
    return done_testing();
}
