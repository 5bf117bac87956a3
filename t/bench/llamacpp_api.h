/* llama.cpp's C API as the benchmarks and references see it (llamacpp_bench, llamacpp_ref):
 * the library is dlopened (node-llama-cpp's prebuilt build, npm package
 * @node-llama-cpp/linux-x64, installed by t/lib/Kvgate/LlamaCpp.pm or
 * `t/bench/engine --install-llamacpp`), so nothing here needs llama.cpp's headers.
 * Header-only.
 *
 * The structs passed or returned by value (llama_model_params, llama_context_params,
 * llama_batch) are declared below for the one llama.cpp version that was checked:
 * llama_version() "0.5.0-dev" as node-llama-cpp 3.22.1 ships it (llama.cpp commit
 * 0ad4a86, as libllama-common's llama_commit() says; ggml 0.25.1). The two params
 * structs are opaque byte arrays of their exact size (80 and 160 bytes, 8-aligned;
 * over 16 bytes they travel in memory in the x86-64 SysV ABI whatever their fields),
 * obtained from the *_default_params functions, and only the fields whose offsets were
 * checked are written. The context params' field order is llama.h's (n_ctx, n_batch,
 * n_ubatch, n_seq_max, three more 32-bit counts in this version, n_threads,
 * n_threads_batch, five enums ending with flash_attn_type, eight 32-bit RoPE/YaRN/defrag
 * values, cb_eval and its data, type_k, type_v, the abort callback and its data, then the
 * booleans embeddings, offload_kqv, no_perf, ...); the offsets below were matched
 * against the bytes llama_context_default_params() returns (n_ctx 512, n_batch 2048,
 * n_ubatch 512, n_seq_max 1, n_threads 4 twice, flash_attn_type -1 = auto, YaRN -1.0f,
 * type_k = type_v = 1 = GGML_TYPE_F16, offload_kqv and no_perf true), and lc_new_ctx_kv
 * checks the defaults it overwrites are still those before writing: a library whose
 * struct moved is refused rather than fed misplaced values. type_k, type_v and
 * flash_attn_type are checked twice: their defaults before, and after the context is
 * made, llama.cpp's own log of what it made (the cache's types, flash attention on or
 * off, the K/V rotation) against what was written (lc_seen below). Another version is refused
 * (exit 3) unless KVG_LLAMA_ABI_FORCE=1. Exit 3 also when the library is absent: the
 * caller skips (a benchmark) or fails (a test that installed it). */
#ifndef KVG_LLAMACPP_API_H
#define KVG_LLAMACPP_API_H

#include <dirent.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the ABI of llama.cpp 0.5.0-dev (llama.h as shipped by node-llama-cpp 3.22.1) ---- */
typedef struct { _Alignas(8) unsigned char b[80]; } lc_model_params;
typedef struct { _Alignas(8) unsigned char b[160]; } lc_context_params;
enum {
    CP_N_CTX = 0, CP_N_BATCH = 4, CP_N_UBATCH = 8, CP_N_SEQ_MAX = 12, CP_N_THREADS = 28,
    CP_N_THREADS_BATCH = 32, CP_FLASH_ATTN = 52, CP_TYPE_K = 104, CP_TYPE_V = 108, CP_OFFLOAD_KQV = 129,
    CP_NO_PERF = 130
};
/* ggml.h's enum ggml_type (F32 0, F16 1, Q8_0 8: blocks of 32 values, one F16 scale
 * each) and llama.h's enum llama_flash_attn_type. */
enum { LC_GGML_TYPE_F32 = 0, LC_GGML_TYPE_F16 = 1, LC_GGML_TYPE_Q8_0 = 8 };
enum { LC_FLASH_ATTN_AUTO = -1, LC_FLASH_ATTN_DISABLED = 0, LC_FLASH_ATTN_ENABLED = 1 };
_Static_assert(sizeof(lc_model_params) == 80 && sizeof(lc_context_params) == 160, "llama.h 0.5.0 sizes");
_Static_assert(CP_TYPE_V + 4 <= CP_OFFLOAD_KQV && CP_NO_PERF < (int)sizeof(lc_context_params), "offsets");

typedef struct lc_batch {
    int32_t n_tokens;
    int32_t *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
} lc_batch;
_Static_assert(sizeof(lc_batch) == 56, "llama_batch");

typedef struct lc_api {
    const char *(*version)(void);
    void (*backend_init)(void);
    void (*log_set)(void (*cb)(int, const char *, void *), void *ud);
    void (*load_all_from_path)(const char *dir);
    lc_model_params (*model_default_params)(void);
    lc_context_params (*context_default_params)(void);
    void *(*model_load_from_file)(const char *path, lc_model_params p);
    void (*model_free)(void *model);
    void *(*init_from_model)(void *model, lc_context_params p);
    void (*free_ctx)(void *ctx);
    const void *(*model_get_vocab)(const void *model);
    int32_t (*vocab_n_tokens)(const void *vocab);
    int32_t (*vocab_eos)(const void *vocab);
    void *(*get_memory)(const void *ctx);
    void (*memory_clear)(void *mem, _Bool data);
    lc_batch (*batch_get_one)(int32_t *tokens, int32_t n);
    lc_batch (*batch_init)(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
    void (*batch_free)(lc_batch b);
    int32_t (*decode)(void *ctx, lc_batch b);
    void (*synchronize)(void *ctx);
    float *(*get_logits_ith)(void *ctx, int32_t i);
    void (*set_n_threads)(void *ctx, int32_t n, int32_t n_batch);
} lc_api;

/* The program's name in messages, and whether llama.cpp's own log is shown (else its
 * errors only). */
static const char *lc_who = "llamacpp";
static int lc_verbose;

/* What llama.cpp's log said of the last context made: the K/V cache's types (from
 * "llama_kv_cache: size = ..., K (q8_0): ..., V (q8_0): ...", ggml_type_name's
 * spelling), whether it rotates K and V (the "attn_rot_k = 1" lines: a Walsh-Hadamard
 * rotation of K and V before they are quantized, which llama.cpp applies to a quantized
 * cache whose head size is a multiple of 64 unless LLAMA_ATTN_ROT_DISABLE=1; -1 not
 * said) and whether flash attention runs ("flash_attn = enabled" / "Flash Attention
 * enabled": 1, "disabled": 0, -1 not said). lc_new_ctx_kv checks them against what it
 * asked for: the log is the one place the library says what it really made. */
typedef struct lc_seen {
    char type_k[16], type_v[16];
    int rot_k, rot_v, flash;
} lc_seen;
static lc_seen lc_last;

__attribute__((unused)) static void lc_seen_reset(void)
{
    memset(&lc_last, 0, sizeof lc_last);
    lc_last.rot_k = lc_last.rot_v = lc_last.flash = -1;
}

/* One log message (llama.cpp formats each line in one call). */
__attribute__((unused)) static void lc_seen_parse(const char *text)
{
    const char *p;
    if (strstr(text, "llama_kv_cache: size =")) {
        if ((p = strstr(text, " K (")))
            sscanf(p + 4, "%15[^)]", lc_last.type_k);
        if ((p = strstr(text, " V (")))
            sscanf(p + 4, "%15[^)]", lc_last.type_v);
    }
    if ((p = strstr(text, "attn_rot_k = ")))
        lc_last.rot_k = atoi(p + 13);
    if ((p = strstr(text, "attn_rot_v = ")))
        lc_last.rot_v = atoi(p + 13);
    if ((p = strstr(text, "Flash Attention ")) || ((p = strstr(text, "flash_attn ")) && strstr(text, "= ")))
        lc_last.flash = strstr(p, "enabled") ? 1 : strstr(p, "disabled") ? 0 : lc_last.flash;
}

__attribute__((unused)) static void lc_log(int level, const char *text, void *ud)
{
    (void)ud;
    lc_seen_parse(text);
    if (lc_verbose || level == 4 /* GGML_LOG_LEVEL_ERROR */)
        fputs(text, stderr);
}

__attribute__((noreturn, unused)) static void lc_die(const char *what)
{
    fprintf(stderr, "%s: %s\n", lc_who, what);
    exit(1);
}

/* Exit 3: no usable library (the caller decides whether that is a skip). */
__attribute__((noreturn, unused)) static void lc_skip(const char *why, const char *detail)
{
    fprintf(stderr, "%s: skipped: %s%s%s\n", lc_who, why, detail ? ": " : "", detail ? detail : "");
    exit(3);
}

/* The library file: the path itself, or libllama*.so in a directory (not libllama-common). */
__attribute__((unused)) static void lc_find_lib(const char *arg, char *path, size_t n, char *dir, size_t dn)
{
    DIR *d = opendir(arg);
    if (!d) {
        const char *slash = strrchr(arg, '/');
        snprintf(path, n, "%s", arg);
        snprintf(dir, dn, "%.*s", slash ? (int)(slash - arg) : 1, slash ? arg : ".");
        return;
    }
    struct dirent *e;
    path[0] = '\0';
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "libllama", 8) == 0 && strncmp(e->d_name, "libllama-", 9) != 0
            && strstr(e->d_name, ".so"))
            snprintf(path, n, "%s/%s", arg, e->d_name);
    closedir(d);
    snprintf(dir, dn, "%s", arg);
}

#define LC_SYM(field, name) do {                                                    \
        *(void **)&api->field = dlsym(h, name);                                     \
        if (!api->field)                                                            \
            lc_skip("symbol missing in the library", name);                         \
    } while (0)

/* Loads the library (lib_arg: libllama*.so or its directory) and its CPU backends;
 * exits 3 when it cannot. */
__attribute__((unused)) static void lc_load_api(lc_api *api, const char *lib_arg)
{
    char path[4096], dir[4096];
    if (!lib_arg)
        lc_skip("no --lib given", NULL);
    lc_find_lib(lib_arg, path, sizeof path, dir, sizeof dir);
    if (!path[0])
        lc_skip("no libllama*.so in", lib_arg);
    /* RUNPATH $ORIGIN finds libggml*.so next to it. */
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        lc_skip("cannot load libllama", dlerror());
    LC_SYM(version, "llama_version");
    const char *v = api->version();
    if (strncmp(v, "0.5.0", 5) != 0 && !getenv("KVG_LLAMA_ABI_FORCE")) {
        fprintf(stderr, "%s: llama.cpp %s: its structs were checked for 0.5.0 only "
                        "(KVG_LLAMA_ABI_FORCE=1 to try anyway)\n", lc_who, v);
        exit(3);
    }
    LC_SYM(backend_init, "llama_backend_init");
    LC_SYM(log_set, "llama_log_set");
    LC_SYM(load_all_from_path, "ggml_backend_load_all_from_path");
    LC_SYM(model_default_params, "llama_model_default_params");
    LC_SYM(context_default_params, "llama_context_default_params");
    LC_SYM(model_load_from_file, "llama_model_load_from_file");
    LC_SYM(model_free, "llama_model_free");
    LC_SYM(init_from_model, "llama_init_from_model");
    LC_SYM(free_ctx, "llama_free");
    LC_SYM(model_get_vocab, "llama_model_get_vocab");
    LC_SYM(vocab_n_tokens, "llama_vocab_n_tokens");
    LC_SYM(vocab_eos, "llama_vocab_eos");
    LC_SYM(get_memory, "llama_get_memory");
    LC_SYM(memory_clear, "llama_memory_clear");
    LC_SYM(batch_get_one, "llama_batch_get_one");
    LC_SYM(batch_init, "llama_batch_init");
    LC_SYM(batch_free, "llama_batch_free");
    LC_SYM(decode, "llama_decode");
    LC_SYM(synchronize, "llama_synchronize");
    LC_SYM(get_logits_ith, "llama_get_logits_ith");
    LC_SYM(set_n_threads, "llama_set_n_threads");
    api->log_set(lc_log, NULL);
    /* The CPU backends are separate libraries (one per ISA level): the best one loads. */
    api->load_all_from_path(dir);
    api->backend_init();
}

__attribute__((unused)) static int32_t lc_get_i32(const lc_context_params *cp, int off)
{
    int32_t v;
    memcpy(&v, cp->b + off, 4);
    return v;
}

__attribute__((unused)) static void lc_set_i32(lc_context_params *cp, int off, int32_t v)
{
    memcpy(cp->b + off, &v, 4);
}

/* The K/V cache and attention a context is made with: ggml types of K and V
 * (LC_GGML_TYPE_*), flash attention (LC_FLASH_ATTN_*), and for a quantized cache
 * whether llama.cpp may rotate it (1: its default; 0: LLAMA_ATTN_ROT_DISABLE=1 while
 * the context is made, the plain per-block quantization). */
typedef struct lc_kv {
    int32_t type_k, type_v, flash_attn;
    int rot;
} lc_kv;

/* ggml_type_name's spelling of the types lc_kv names; NULL for another. */
__attribute__((unused)) static const char *lc_type_name(int32_t t)
{
    return t == LC_GGML_TYPE_F32 ? "f32" : t == LC_GGML_TYPE_F16 ? "f16" : t == LC_GGML_TYPE_Q8_0 ? "q8_0" : NULL;
}

/* A context of n_ctx positions, batches of n_batch tokens in one ubatch, n_seq
 * sequences, `threads` threads, the K/V cache `kv`. Dies when the library's defaults
 * are not the ones the offsets were checked against, and when its log does not say it
 * made the cache asked for (the types, flash attention when asked on or off, no
 * rotation when it was refused) or says nothing of it. */
__attribute__((unused)) static void *lc_new_ctx_kv(const lc_api *api, void *model, uint32_t n_ctx, uint32_t n_batch,
                                                   uint32_t n_seq, int32_t threads, const lc_kv *kv)
{
    lc_context_params cp = api->context_default_params();
    _Bool no_perf = 1;
    const char *tk = lc_type_name(kv->type_k), *tv = lc_type_name(kv->type_v);
    char why[256];
    if (lc_get_i32(&cp, CP_N_SEQ_MAX) != 1 || lc_get_i32(&cp, CP_TYPE_K) != LC_GGML_TYPE_F16
        || lc_get_i32(&cp, CP_TYPE_V) != LC_GGML_TYPE_F16 || lc_get_i32(&cp, CP_FLASH_ATTN) != LC_FLASH_ATTN_AUTO
        || cp.b[CP_OFFLOAD_KQV] != 1)
        lc_die("llama_context_default_params: not the defaults the field offsets were checked against "
               "(another llama.h layout)");
    if (!tk || !tv || kv->flash_attn < LC_FLASH_ATTN_AUTO || kv->flash_attn > LC_FLASH_ATTN_ENABLED)
        lc_die("lc_new_ctx_kv: a K/V type or flash attention setting this header does not know");
    lc_set_i32(&cp, CP_N_CTX, (int32_t)n_ctx);
    lc_set_i32(&cp, CP_N_BATCH, (int32_t)n_batch);
    lc_set_i32(&cp, CP_N_UBATCH, (int32_t)n_batch);
    lc_set_i32(&cp, CP_N_SEQ_MAX, (int32_t)n_seq);
    lc_set_i32(&cp, CP_N_THREADS, threads);
    lc_set_i32(&cp, CP_N_THREADS_BATCH, threads);
    memcpy(cp.b + CP_NO_PERF, &no_perf, 1);
    lc_set_i32(&cp, CP_TYPE_K, kv->type_k);
    lc_set_i32(&cp, CP_TYPE_V, kv->type_v);
    lc_set_i32(&cp, CP_FLASH_ATTN, kv->flash_attn);
    /* llama.cpp reads LLAMA_ATTN_ROT_DISABLE when it makes the cache. */
    char *saved = getenv("LLAMA_ATTN_ROT_DISABLE") ? strdup(getenv("LLAMA_ATTN_ROT_DISABLE")) : NULL;
    if (!kv->rot)
        setenv("LLAMA_ATTN_ROT_DISABLE", "1", 1);
    else
        unsetenv("LLAMA_ATTN_ROT_DISABLE");
    lc_seen_reset();
    void *ctx = api->init_from_model(model, cp);
    if (saved) {
        setenv("LLAMA_ATTN_ROT_DISABLE", saved, 1);
        free(saved);
    } else {
        unsetenv("LLAMA_ATTN_ROT_DISABLE");
    }
    if (!ctx)
        lc_die("llama_init_from_model failed (--verbose shows why)");
    why[0] = '\0';
    if (strcmp(lc_last.type_k, tk) != 0 || strcmp(lc_last.type_v, tv) != 0)
        snprintf(why, sizeof why, "K/V cache types %s/%s asked for, its log says \"%s\"/\"%s\"", tk, tv,
                 lc_last.type_k, lc_last.type_v);
    else if (kv->flash_attn != LC_FLASH_ATTN_AUTO && lc_last.flash != kv->flash_attn)
        snprintf(why, sizeof why, "flash attention %s asked for, its log says %s",
                 kv->flash_attn ? "on" : "off", lc_last.flash < 0 ? "nothing of it" : lc_last.flash ? "on" : "off");
    else if (!kv->rot && (lc_last.rot_k != 0 || lc_last.rot_v != 0))
        snprintf(why, sizeof why, "no K/V rotation asked for, its log says attn_rot_k %d, attn_rot_v %d",
                 lc_last.rot_k, lc_last.rot_v);
    if (why[0]) {
        fprintf(stderr, "%s: llama_init_from_model: %s\n", lc_who, why);
        exit(1);
    }
    return ctx;
}

/* lc_new_ctx_kv for the two settings the tools use most. exact: the K/V cache in F32
 * and no flash attention (the plain attention path: K*Q, softmax and V*KQ in F32), the
 * most precise llama.cpp computes on the CPU; otherwise its defaults (F16 cache, flash
 * attention chosen automatically), as a user runs it. */
__attribute__((unused)) static void *lc_new_ctx(const lc_api *api, void *model, uint32_t n_ctx, uint32_t n_batch,
                                                uint32_t n_seq, int32_t threads, int exact)
{
    lc_kv kv = { LC_GGML_TYPE_F16, LC_GGML_TYPE_F16, LC_FLASH_ATTN_AUTO, 1 };
    if (exact)
        kv = (lc_kv){ LC_GGML_TYPE_F32, LC_GGML_TYPE_F32, LC_FLASH_ATTN_DISABLED, 1 };
    return lc_new_ctx_kv(api, model, n_ctx, n_batch, n_seq, threads, &kv);
}

#endif
