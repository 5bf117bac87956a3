/* kvgate-engine: the engine daemon. Loads a model, builds the KV pool, the prefix cache
 * and the scheduler, prefills an optional warm-up file, then serves clients on a unix
 * socket until SIGTERM or SIGINT (engine/daemon.h).
 *
 * Exit status: 0 after a clean stop, 1 on a startup or runtime error, 2 on bad usage. */
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cliargs.h"
#include "chat_choice.h"
#include "daemon.h"
#include "forward.h"
#include "kv_cache.h"
#include "kv_disk.h"
#include "kv_host.h"
#include "model.h"
#include "prefix_cache.h"
#include "scheduler.h"
#include "warmup.h"

static const char USAGE[] =
    "usage: kvgate-engine --model PATH --socket PATH [options]\n"
    "\n"
    "Serves one model to kvgate clients (the nginx module, kvgate-cli) on a unix socket.\n"
    "Prints one line on stdout when it accepts connections; stops cleanly on SIGTERM/SIGINT\n"
    "(running requests get --drain-timeout to finish; a second signal cancels them).\n"
    "\n"
    "  --model PATH            llama2.c .bin, GGUF file, Hugging Face directory or synthetic:NAME\n"
    "  --tokenizer PATH        tokenizer file (llama2.c models need one)\n"
    "  --backend NAME          cpu (default) or cuda (an NVIDIA GPU; the KV pool in its memory)\n"
    "  --device N              cuda: the GPU to use (default 0)\n"
    "  --batch-invariant on|off  cuda: on (default): a row's results never depend on the batch\n"
    "                          or the chunking (pinned GEMM algorithms, fixed attention splits);\n"
    "                          off: the fastest kernels for each shape\n"
    "  --socket PATH           the unix socket to listen on (a stale socket file is replaced)\n"
    "  --socket-mode MODE      octal file mode of the socket (default 0660)\n"
    "  --socket-group NAME     group of the socket (e.g. the nginx workers' group)\n"
    "  --served-model-name N   the model name clients use (default: the model's)\n"
    "  --chat-template NAME|FILE  the chat template: a Jinja file, or a built-in (plain,\n"
    "                          chatml, llama2, llama3); default: the model's own. A model\n"
    "                          with none and no --chat-template refuses chat requests\n"
    "  --kv-memory SIZE        memory for the KV pool, e.g. 512M, 4G (default: cpu 256M; cuda\n"
    "                          90% of the GPU memory free once the weights are loaded)\n"
    "  --kv-dtype auto|int8    how the KV pool stores keys and values: auto (default) as the\n"
    "                          backend does (cpu: float32; cuda: BF16); int8: the layers past\n"
    "                          --kv-full-precision-layers as int8 with a scale per token and\n"
    "                          KV head (about 3.8x less memory for them on cpu, 1.9x on\n"
    "                          cuda; docs/operations.md has the quality figures)\n"
    "  --kv-full-precision-layers N  with --kv-dtype int8: the first N layers keep float32\n"
    "                          (cpu) or BF16 (cuda)\n"
    "                          (default 3; N >= the model's layers: every layer, as auto)\n"
    "  --kv-disk DIR           keep blocks evicted from the KV pool in DIR (one file of\n"
    "                          --kv-disk-size; written in the background, read back on a\n"
    "                          prefix hit, found again by the next engine on DIR with the\n"
    "                          same model; docs/operations.md)\n"
    "  --kv-disk-size SIZE     the disk tier's size, e.g. 512M, 4G (required with --kv-disk)\n"
    "  --kv-disk-wipe-tenant T drop tenant T's blocks from --kv-disk DIR, then exit (the\n"
    "                          engine on DIR must be stopped)\n"
    "  --kv-host-memory SIZE   keep blocks evicted from a GPU's KV pool in SIZE of pinned host\n"
    "                          memory, copied back on a prefix hit; before --kv-disk when\n"
    "                          both are given (cuda backend: the cpu pool is host memory)\n"
    "  --context N             context length (default: the model's)\n"
    "  --threads N             CPU threads (default: all online CPUs)\n"
    "  --max-batch-tokens N    tokens per forward step (default 512)\n"
    "  --max-running N         samples running at once (default 64)\n"
    "  --max-waiting N         requests waiting to start before new ones get 429 (default 256)\n"
    "  --cache-ttl SECONDS     how long an unused cached block is kept (default 300)\n"
    "  --pinned-share F        share of the pool pinned blocks may hold (default 0.5)\n"
    "  --tenant-pinned-blocks N  most blocks one tenant may have pinned or held by\n"
    "                          cache_control (default 0: only --pinned-share bounds it)\n"
    "  --tenant-quota F        per-tenant share of the pool, evicted first when over (default 0: none)\n"
    "  --warmup FILE           JSON Lines prompts to prefill before serving (see engine/warmup.h)\n"
    "  --drain-timeout SECONDS time running requests get to finish on stop (default 10)\n"
    "  --ring-slots N          message slots per ring (power of two; default 256 / 1024)\n"
    "  --sq-data SIZE          submission data area per client (power of two; default: twice the\n"
    "                          largest request the context allows)\n"
    "  --cq-data SIZE          completion data area per client (power of two; default 1M)\n"
    "  --max-unread-tokens N   tokens a sample may run ahead of what its client has read\n"
    "                          before the request is held until it reads (default 256;\n"
    "                          bounds a slow stream's memory in the gateway)\n"
    "  --busy-poll-us N        after work, watch the rings N microseconds before sleeping\n"
    "                          (default 50; 0 never: saves CPU, costs a wake-up per request)\n"
    "  --help                  show this help\n";

static kvg_daemon *g_daemon;

static void on_signal(int sig)
{
    (void)sig;
    if (g_daemon)
        kvg_daemon_request_stop(g_daemon);
}

static int usage_error(const char *fmt, const char *a)
{
    return kvg_usage_error("kvgate-engine", fmt, a);
}

static void progress(void *ctx, const char *what, uint64_t done, uint64_t total)
{
    (void)ctx;
    if (total >= ((uint64_t)256 << 20))
        fprintf(stderr, "kvgate-engine: %s %llu/%llu MiB\n", what, (unsigned long long)(done >> 20),
                (unsigned long long)(total >> 20));
}

/* The disk tier (--kv-disk): NULL after printing why. */
static kvg_kv_disk *open_disk(const char *dir, uint64_t bytes, const kvg_model *m, kvg_kv_pool *pool,
                              kvg_prefix_cache *pc)
{
    kvg_kv_disk_ident id;
    kvg_kv_disk *disk;
    kvg_kv_disk_stats st;
    char err[512];
    int sync;
    if (pool->block_bytes && !pool->xfer_out) {
        fprintf(stderr, "kvgate-engine: --kv-disk: this backend's KV pool cannot export blocks\n");
        return NULL;
    }
    memset(&id, 0, sizeof id);
    memcpy(id.model_id, m->id, sizeof id.model_id);
    id.n_layers = pool->geom.n_layers;
    id.n_kv_heads = pool->geom.n_kv_heads;
    id.head_dim = pool->geom.head_dim;
    id.block_tokens = pool->geom.block_tokens;
    id.dtype = pool->block_bytes ? kvg_kv_disk_cuda_dtype(pool) : kvg_kv_disk_host_dtype(pool);
    id.payload_bytes = kvg_kv_xfer_bytes(pool);
    disk = kvg_kv_disk_open(dir, bytes, 0, &id, err, sizeof err);
    if (!disk) {
        fprintf(stderr, "kvgate-engine: --kv-disk %s\n", err);
        return NULL;
    }
    if (kvg_pc_set_disk(pc, disk, err, sizeof err) != 0) {
        fprintf(stderr, "kvgate-engine: --kv-disk: %s\n", err);
        kvg_kv_disk_close(disk);
        return NULL;
    }
    /* KVGATE_KV_DISK_SYNC=1: disk reads on the scheduler's thread, as before the reader
     * thread (the baseline of t/bench/tiers --stall). */
    sync = getenv("KVGATE_KV_DISK_SYNC") && strcmp(getenv("KVGATE_KV_DISK_SYNC"), "1") == 0;
    kvg_pc_disk_sync_reads(pc, sync);
    kvg_kv_disk_get_stats(disk, &st);
    fprintf(stderr, "kvgate-engine: KV disk %s: %lld slots of %llu bytes (%.1f MiB), %llu blocks found "
            "(%llu expired, dropped)%s\n", kvg_kv_disk_path(disk), (long long)st.slots_total,
            (unsigned long long)st.slot_bytes, (double)st.slots_total * (double)st.slot_bytes / (1024.0 * 1024.0),
            (unsigned long long)st.restored, (unsigned long long)st.expired,
            sync ? ", reads synchronous (KVGATE_KV_DISK_SYNC=1)" : "");
    return disk;
}

/* The host tier (--kv-host-memory): its pinned memory from the backend, after the disk
 * tier (its evictions go there). NULL after printing why. */
static kvg_kv_host *open_host(kvg_backend *be, uint64_t bytes, kvg_kv_pool *pool, kvg_prefix_cache *pc,
                              void **buf)
{
    kvg_kv_host *h;
    char err[512];
    *buf = NULL;
    if (!be->ops->host_alloc || !pool->xfer_out) {
        fprintf(stderr, "kvgate-engine: --kv-host-memory: the %s backend's KV pool is in host memory already "
                "(give it that memory with --kv-memory)\n", be->ops->name);
        return NULL;
    }
    *buf = be->ops->host_alloc(be, (size_t)bytes);
    if (!*buf) {
        fprintf(stderr, "kvgate-engine: --kv-host-memory: cannot pin %llu bytes of host memory\n",
                (unsigned long long)bytes);
        return NULL;
    }
    h = kvg_kv_host_new(*buf, (size_t)bytes, kvg_kv_xfer_bytes(pool), err, sizeof err);
    if (!h || kvg_pc_set_host(pc, h, err, sizeof err) != 0) {
        fprintf(stderr, "kvgate-engine: %s\n", err);
        kvg_kv_host_free(h);
        be->ops->host_free(be, *buf);
        *buf = NULL;
        return NULL;
    }
    {
        kvg_kv_host_stats st;
        kvg_kv_host_get_stats(h, &st);
        fprintf(stderr, "kvgate-engine: KV host memory: %lld blocks of %llu bytes (%.1f MiB, pinned)\n",
                (long long)st.slots_total, (unsigned long long)st.slot_bytes,
                (double)st.slots_total * (double)st.slot_bytes / (1024.0 * 1024.0));
    }
    return h;
}

static void close_host(kvg_kv_host *h)
{
    kvg_kv_host_stats st;
    kvg_kv_host_get_stats(h, &st);
    fprintf(stderr, "kvgate-engine: KV host memory: %llu blocks in (%llu bytes), %llu copied back (%llu bytes), "
            "%llu misses, %llu evicted (%llu to disk), %lld slots used\n", (unsigned long long)st.puts,
            (unsigned long long)st.bytes_out, (unsigned long long)st.hits, (unsigned long long)st.bytes_in,
            (unsigned long long)st.misses, (unsigned long long)st.evictions, (unsigned long long)st.spilled,
            (long long)st.slots_used);
    kvg_kv_host_free(h);
}

/* Writes out the disk tier's queue, says what it did, closes it. */
static void close_disk(kvg_kv_disk *disk)
{
    kvg_kv_disk_stats st;
    kvg_kv_disk_flush(disk);
    kvg_kv_disk_get_stats(disk, &st);
    fprintf(stderr, "kvgate-engine: KV disk: %llu blocks written (%llu bytes, %.3f s), %llu read back "
            "(%llu bytes, %.3f s), %llu misses, %llu evicted (%llu by a quota), %llu expired, %llu dropped, "
            "%llu corrupt, %llu I/O errors, %lld slots used\n", (unsigned long long)st.blocks_written,
            (unsigned long long)st.bytes_written, st.write_seconds, (unsigned long long)st.hits,
            (unsigned long long)st.bytes_read, st.read_seconds, (unsigned long long)st.misses,
            (unsigned long long)st.evictions, (unsigned long long)st.quota_evictions,
            (unsigned long long)st.expired, (unsigned long long)st.dropped,
            (unsigned long long)st.corrupt, (unsigned long long)st.io_errors, (long long)st.slots_used);
    kvg_kv_disk_close(disk);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *tok_path = NULL, *backend = "cpu", *socket_path = NULL;
    const char *served = NULL, *tpl_name = NULL, *warmup_path = NULL, *group = NULL;
    const char *disk_dir = NULL, *wipe_tenant = NULL;
    uint64_t disk_bytes = 0, host_bytes = 0;
    kvg_kv_host *host = NULL;
    void *host_buf = NULL;
    int kv_dtype = KVG_KV_F32;
    long kv_full_layers = 3;
    int kv_given = 0;
    long device = 0, batch_inv = 1;
    uint64_t kv_bytes = (uint64_t)256 << 20, sq_data = 0, cq_data = 0;
    long busy_poll = 50, unread_tokens = 0, threads = 0, ctx = 0, max_batch = 0, max_running = 0, max_waiting = 0, mode = 0660, ring_slots = 0;
    double cache_ttl = 300, pinned_share = 0.5, quota = 0, drain = 10;
    long tenant_pins = 0;
    char err[512];
    int rc = 1;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (i + 1 >= argc)
            return usage_error("%s needs a value", a);
        const char *v = argv[++i];
        char *end;
        if (!strcmp(a, "--model"))
            model_path = v;
        else if (!strcmp(a, "--tokenizer"))
            tok_path = v;
        else if (!strcmp(a, "--backend"))
            backend = v;
        else if (!strcmp(a, "--device")) {
            if (kvg_arg_long(v, 0, 1024, &device) != 0)
                return usage_error("--device: '%s' is not a device number 0..1024", v);
        } else if (!strcmp(a, "--batch-invariant")) {
            if (strcmp(v, "on") && strcmp(v, "off"))
                return usage_error("--batch-invariant: '%s' is not on or off", v);
            batch_inv = !strcmp(v, "on");
        }
        else if (!strcmp(a, "--socket"))
            socket_path = v;
        else if (!strcmp(a, "--socket-mode")) {
            errno = 0;
            mode = strtol(v, &end, 8);
            if (errno || end == v || *end || mode < 0 || mode > 07777)
                return usage_error("--socket-mode: '%s' is not an octal file mode like 0660", v);
        } else if (!strcmp(a, "--socket-group"))
            group = v;
        else if (!strcmp(a, "--served-model-name"))
            served = v;
        else if (!strcmp(a, "--chat-template"))
            tpl_name = v;
        else if (!strcmp(a, "--kv-memory")) {
            if (kvg_arg_size(v, &kv_bytes) != 0)
                return usage_error("--kv-memory: '%s' is not a size like 512M or 4G", v);
            kv_given = 1;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (strcmp(v, "auto") && strcmp(v, "int8"))
                return usage_error("--kv-dtype: '%s' is not auto or int8", v);
            kv_dtype = !strcmp(v, "int8") ? KVG_KV_INT8 : KVG_KV_F32;
        } else if (!strcmp(a, "--kv-full-precision-layers")) {
            if (kvg_arg_long(v, 0, 4096, &kv_full_layers) != 0)
                return usage_error("--kv-full-precision-layers: '%s' is not an integer 0..4096", v);
        } else if (!strcmp(a, "--kv-disk")) {
            if (!*v)
                return usage_error("--kv-disk: '%s' is not a directory", v);
            disk_dir = v;
        } else if (!strcmp(a, "--kv-host-memory")) {
            if (kvg_arg_size(v, &host_bytes) != 0 || host_bytes == 0)
                return usage_error("--kv-host-memory: '%s' is not a size like 512M or 4G", v);
        } else if (!strcmp(a, "--kv-disk-size")) {
            if (kvg_arg_size(v, &disk_bytes) != 0 || disk_bytes == 0)
                return usage_error("--kv-disk-size: '%s' is not a size like 512M or 4G", v);
        } else if (!strcmp(a, "--kv-disk-wipe-tenant"))
            wipe_tenant = v;
        else if (!strcmp(a, "--context")) {
            if (kvg_arg_long(v, 1, INT_MAX, &ctx) != 0)
                return usage_error("--context: '%s' is not a positive integer", v);
        } else if (!strcmp(a, "--threads")) {
            if (kvg_arg_long(v, 1, 1024, &threads) != 0)
                return usage_error("--threads: '%s' is not an integer 1..1024", v);
        } else if (!strcmp(a, "--max-batch-tokens")) {
            if (kvg_arg_long(v, 1, 1 << 20, &max_batch) != 0)
                return usage_error("--max-batch-tokens: '%s' is not an integer 1..1048576", v);
        } else if (!strcmp(a, "--max-running")) {
            if (kvg_arg_long(v, 1, 1 << 16, &max_running) != 0)
                return usage_error("--max-running: '%s' is not an integer 1..65536", v);
        } else if (!strcmp(a, "--max-waiting")) {
            if (kvg_arg_long(v, 1, 1 << 20, &max_waiting) != 0)
                return usage_error("--max-waiting: '%s' is not an integer 1..1048576", v);
        } else if (!strcmp(a, "--cache-ttl")) {
            if (kvg_arg_double(v, 0.001, 1e7, &cache_ttl) != 0)
                return usage_error("--cache-ttl: '%s' is not a number of seconds > 0", v);
        } else if (!strcmp(a, "--tenant-pinned-blocks")) {
            if (kvg_arg_long(v, 0, INT32_MAX, &tenant_pins) != 0)
                return usage_error("--tenant-pinned-blocks: '%s' is not a block count >= 0", v);
        } else if (!strcmp(a, "--pinned-share")) {
            if (kvg_arg_double(v, 0, 1, &pinned_share) != 0)
                return usage_error("--pinned-share: '%s' is not a number 0..1", v);
        } else if (!strcmp(a, "--tenant-quota")) {
            if (kvg_arg_double(v, 0, 1, &quota) != 0)
                return usage_error("--tenant-quota: '%s' is not a number 0..1", v);
        } else if (!strcmp(a, "--warmup"))
            warmup_path = v;
        else if (!strcmp(a, "--drain-timeout")) {
            if (kvg_arg_double(v, 0, 1e6, &drain) != 0)
                return usage_error("--drain-timeout: '%s' is not a number of seconds >= 0", v);
        } else if (!strcmp(a, "--max-unread-tokens")) {
            if (kvg_arg_long(v, 1, 1 << 20, &unread_tokens) != 0)
                return usage_error("--max-unread-tokens: '%s' is not an integer 1..1048576", v);
        } else if (!strcmp(a, "--busy-poll-us")) {
            if (kvg_arg_long(v, 0, 1000000, &busy_poll) != 0)
                return usage_error("--busy-poll-us: '%s' is not an integer 0..1000000", v);
        } else if (!strcmp(a, "--ring-slots")) {
            if (kvg_arg_long(v, 1, 1 << 20, &ring_slots) != 0 || (ring_slots & (ring_slots - 1)))
                return usage_error("--ring-slots: '%s' is not a power of two up to 1048576", v);
        } else if (!strcmp(a, "--sq-data")) {
            if (kvg_arg_size(v, &sq_data) != 0 || (sq_data & (sq_data - 1)) || sq_data < 64)
                return usage_error("--sq-data: '%s' is not a power of two >= 64 bytes", v);
        } else if (!strcmp(a, "--cq-data")) {
            if (kvg_arg_size(v, &cq_data) != 0 || (cq_data & (cq_data - 1)) || cq_data < 4096)
                return usage_error("--cq-data: '%s' is not a power of two >= 4096 bytes", v);
        } else
            return usage_error("unknown option %s", a);
    }
    if (!model_path)
        return usage_error("%s", "--model is required");
    if (tpl_name && !kvg_chat_builtin(tpl_name) && access(tpl_name, R_OK) != 0)
        return usage_error("--chat-template: '%s' is neither a built-in (" KVG_CHAT_BUILTIN_NAMES
                           ") nor a readable file", tpl_name);
    if (disk_dir && !disk_bytes)
        return usage_error("%s", "--kv-disk needs --kv-disk-size");
    if ((disk_bytes || wipe_tenant) && !disk_dir)
        return usage_error("%s", "--kv-disk-size and --kv-disk-wipe-tenant need --kv-disk");
    if (!socket_path && !wipe_tenant)
        return usage_error("%s", "--socket is required");
    int gid = -1;
    if (group) {
        struct group *g = getgrnam(group);
        if (!g) {
            fprintf(stderr, "kvgate-engine: --socket-group: no group named '%s'\n", group);
            return 2;
        }
        gid = (int)g->gr_gid;
    }
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? n : 1;
    }

    if (!strcmp(backend, "cuda") && kvg_backend_cuda_probe((int)device, err, sizeof err) != 0) {
        fprintf(stderr, "kvgate-engine: --backend cuda: %s\n", err);
        return 1;
    }
    kvg_model_load_opts lo = { tok_path, progress, NULL, (int)ctx };
    kvg_model *m = kvg_model_load(model_path, &lo, err, sizeof err);
    kvg_backend *be = NULL;
    kvg_kv_pool *pool = NULL;
    kvg_forward *fw = NULL;
    kvg_prefix_cache *pc = NULL;
    kvg_daemon *d = NULL;
    kvg_kv_disk *disk = NULL;
    kvg_warmup *w = NULL;
    kvg_chat_choice chat;
    if (!m) {
        fprintf(stderr, "kvgate-engine: %s\n", err);
        return 1;
    }
    {
        char feat[512];
        fprintf(stderr, "kvgate-engine: model family %s\n", kvg_model_features(m, feat, sizeof feat));
    }
    if (kvg_chat_choose(&chat, tpl_name, m, err, sizeof err) != 0) {
        fprintf(stderr, "kvgate-engine: %s\n", err);
        kvg_model_free(m);
        return 1;
    }
    kvg_backend_opts bo;
    memset(&bo, 0, sizeof bo);
    bo.n_threads = (int)threads;
    bo.device = (int)device;
    bo.batch_invariant = (int)batch_inv;
    be = kvg_backend_new_opts(backend, m, &bo, err, sizeof err);
    if (!be) {
        fprintf(stderr, "kvgate-engine: --backend %s: %s\n", backend, err);
        goto out;
    }
    kvg_kv_geom g;
    kvg_forward_kv_geom(m, 0, &g);
    g.dtype = kv_dtype;
    g.full_layers = (int)kv_full_layers;
    if (kv_dtype == KVG_KV_INT8) {
        if (kv_full_layers >= m->cfg.n_layers)
            fprintf(stderr, "kvgate-engine: --kv-dtype int8 with --kv-full-precision-layers %ld: all %d layers "
                    "keep %s\n", kv_full_layers, m->cfg.n_layers, strcmp(backend, "cpu") ? "BF16" : "float32");
        else
            fprintf(stderr, "kvgate-engine: KV int8: layers 0..%ld %s, %ld..%d int8: %zu bytes a block "
                    "(%s: %zu)\n", kv_full_layers - 1, strcmp(backend, "cpu") ? "BF16" : "float32",
                    kv_full_layers, m->cfg.n_layers - 1, kvg_backend_kv_block_bytes(be, &g),
                    strcmp(backend, "cpu") ? "BF16" : "float32",
                    kvg_backend_kv_block_bytes(be, &(kvg_kv_geom){ .n_layers = g.n_layers,
                    .n_kv_heads = g.n_kv_heads, .head_dim = g.head_dim, .block_tokens = g.block_tokens }));
    }
    /* A device backend's pool lives in its memory: by default most of what the weights
     * left free. */
    if (!kv_given)
        kv_bytes = kvg_backend_kv_default_budget(be, 0.9, (size_t)kv_bytes);
    int32_t n_blocks = kvg_backend_kv_blocks_for_budget(be, &g, (size_t)kv_bytes);
    if (n_blocks < 1) {
        fprintf(stderr, "kvgate-engine: --kv-memory %llu bytes holds no KV block (one block is %zu bytes)\n",
                (unsigned long long)kv_bytes, kvg_backend_kv_block_bytes(be, &g));
        goto out;
    }
    pool = kvg_backend_kv_pool_new(be, &g, n_blocks, err, sizeof err);
    fw = pool ? kvg_forward_new(m, be, pool, err, sizeof err) : NULL;
    kvg_pc_config pcfg;
    memset(&pcfg, 0, sizeof pcfg);
    memcpy(pcfg.model_id, m->id, sizeof pcfg.model_id);
    pcfg.default_ttl_ms = (int64_t)(cache_ttl * 1000.0);
    pcfg.pinned_share = pinned_share;
    pcfg.tenant_pin_blocks = (int32_t)tenant_pins;
    pcfg.default_quota = quota;
    pc = fw ? kvg_pc_new(pool, &pcfg, err, sizeof err) : NULL;
    if (!pc) {
        fprintf(stderr, "kvgate-engine: %s\n", err);
        goto out;
    }
    if (disk_dir && (disk = open_disk(disk_dir, disk_bytes, m, pool, pc)) == NULL)
        goto out;
    if (host_bytes && !wipe_tenant && (host = open_host(be, host_bytes, pool, pc, &host_buf)) == NULL)
        goto out;
    if (wipe_tenant) {
        int64_t n = kvg_pc_wipe_tenant(pc, wipe_tenant, strlen(wipe_tenant));
        printf("kvgate-engine: --kv-disk-wipe-tenant %s: %lld blocks dropped from %s\n", wipe_tenant,
               (long long)n, kvg_kv_disk_path(disk));
        rc = 0;
        goto out;
    }
    kvg_sched_config sc;
    memset(&sc, 0, sizeof sc);
    sc.max_batch_tokens = (int32_t)max_batch;
    sc.max_running = (int32_t)max_running;
    kvg_daemon_config dc;
    memset(&dc, 0, sizeof dc);
    dc.socket_path = socket_path;
    dc.socket_mode = (int)mode;
    dc.socket_gid = gid;
    dc.served_name = served;
    dc.chat = &chat.info;
    dc.chat_src = chat.src;
    dc.chat_len = chat.len;
    dc.max_waiting = (int)max_waiting;
    dc.drain_timeout_ms = drain == 0 ? -1 : (int)(drain * 1000.0);
    dc.ring_slots = (uint32_t)ring_slots;
    dc.busy_poll_us = busy_poll == 0 ? -1 : (int)busy_poll;
    dc.hold_tokens = (int)unread_tokens;
    dc.sq_data_bytes = sq_data;
    dc.cq_data_bytes = cq_data;
    d = kvg_daemon_new(m, fw, pc, pool, &sc, &dc, err, sizeof err);
    if (!d) {
        fprintf(stderr, "kvgate-engine: %s\n", err);
        goto out;
    }
    if (warmup_path) {
        kvg_warmup_result res;
        w = kvg_warmup_load(warmup_path, m->tokenizer, m->cfg.vocab_size, err, sizeof err);
        if (!w || kvg_daemon_warmup(d, w, &res, err, sizeof err) != 0) {
            fprintf(stderr, "kvgate-engine: --warmup %s\n", err);
            goto out;
        }
        fprintf(stderr, "kvgate-engine: %s\n", res.summary);
    }
    /* Signals only stop the loop (a write to an eventfd); the socket is created after
     * the handlers exist, so no client ever sees a half-started engine. */
    g_daemon = d;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (kvg_daemon_listen(d, err, sizeof err) != 0) {
        fprintf(stderr, "kvgate-engine: --socket %s\n", err);
        goto out;
    }
    {
        char pool_mb[32];
        snprintf(pool_mb, sizeof pool_mb, "%.1f MiB",
                 (double)n_blocks * (double)kvg_backend_kv_block_bytes(be, &g) / (1024.0 * 1024.0));
        char bdesc[200];
        kvg_backend_describe(be, bdesc, sizeof bdesc);
        char tdesc[400];
        kvg_chat_template_summary(&chat.info, tdesc, sizeof tdesc);
        printf("kvgate-engine: ready on %s: model %s (%s, id %.16s, context %d, vocabulary %d), "
               "KV pool %d blocks of %d tokens (%s), backend %s, %ld threads, chat template %s\n",
               socket_path, served ? served : m->name, m->format, m->id_hex, m->cfg.max_seq_len,
               m->cfg.vocab_size, (int)n_blocks, g.block_tokens ? g.block_tokens : KVG_KV_BLOCK_TOKENS_DEFAULT,
               pool_mb, bdesc, threads, tdesc);
        fflush(stdout);
    }
    if (kvg_daemon_run(d, err, sizeof err) != 0) {
        fprintf(stderr, "kvgate-engine: %s\n", err);
        goto out;
    }
    rc = 0;
out:
    g_daemon = NULL;
    kvg_daemon_free(d);
    kvg_warmup_free(w);
    if (disk) {
        /* A clean stop leaves the host tier's and the pool's cached blocks on disk for the
         * next engine. */
        if (rc == 0 && !wipe_tenant)
            kvg_pc_persist(pc);
        kvg_pc_set_disk(pc, NULL, NULL, 0);
    }
    if (host) {
        kvg_pc_set_host(pc, NULL, NULL, 0);
        close_host(host);
    }
    if (host_buf)
        be->ops->host_free(be, host_buf);
    if (disk)
        close_disk(disk);
    kvg_pc_free(pc);
    kvg_forward_free(fw);
    kvg_kv_pool_free(pool);
    kvg_backend_free(be);
    kvg_model_free(m);
    kvg_chat_choice_free(&chat);
    return rc;
}
