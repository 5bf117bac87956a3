/* GEMM figures: kvg_gemm (F32 and BF16 weights) next to OpenBLAS cblas_sgemm on the
 * shapes of the 15M and 110M stories models, 1 and 2 threads, plus how many outputs of
 * row 0 change between an M=64 call and the same row alone (OpenBLAS vs kvgate).
 *
 *   build/bench/gemm_bench [--quick]
 *
 * Figures are medians of alternating rounds (kvgate F32, kvgate BF16 and, on one
 * thread, OpenBLAS take turns), so a shared machine's changing load hits all alike.
 * OpenBLAS on two threads runs in a child process (its workers keep spinning after
 * each call and would slow kvgate in this one). OpenBLAS runs as this machine's
 * environment configures it (OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE may be set for other
 * software) and, when either is set, also "native": in a re-executed copy of this
 * program with both unset. This process's environment is never changed. Weights are
 * reused call after call, so they sit in L3 where they fit (M = 1 is then faster than
 * a real decode from DRAM). Figures only: nothing here asserts a speed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cpu/gemm.h"
#include "cpu/threadpool.h"

/* OpenBLAS entry points (declared here: the bench is built without its include path). */
void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
void openblas_set_num_threads(int n);
char *openblas_get_corename(void);
char *openblas_get_config(void);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

static const int shapes[][2] = {
    /* N (out), K (in) */
    { 768, 768 }, { 2048, 768 }, { 768, 2048 },  /* 110M: wq/wk/wv/wo, w1/w3, w2 */
    { 288, 288 }, { 768, 288 }, { 288, 768 },    /* 15M */
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])
static const int Ms[] = { 1, 16, 64, 512 };
#define N_MS (int)(sizeof Ms / sizeof Ms[0])
#define MAX_M 512
#define MAX_DIM 2048

static int quick;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef void (*run_fn)(void *ctx);

/* Contenders are timed in alternating rounds (one batch of each per round) and the
 * median per-call time of each is kept, so that a shared machine's load drifts
 * through all of them alike. */
typedef struct contender {
    run_fn fn;
    void *ctx;
    int reps;
    double samples[9];
} contender;

static void calibrate(contender *c)
{
    double min_s = quick ? 0.008 : 0.02;
    c->fn(c->ctx);
    c->reps = 1;
    for (;;) {
        double t0 = now();
        for (int i = 0; i < c->reps; i++)
            c->fn(c->ctx);
        double dt = now() - t0;
        if (dt >= min_s / 4 || c->reps > (1 << 20)) {
            c->reps = (int)(c->reps * (min_s / (dt > 1e-9 ? dt : 1e-9))) + 1;
            return;
        }
        c->reps *= 4;
    }
}

/* Seconds per call (median) for each of n contenders. */
static void time_calls(contender *cs, int n, double *out)
{
    int rounds = quick ? 3 : 9;
    for (int i = 0; i < n; i++)
        calibrate(&cs[i]);
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n; i++) {
            double t0 = now();
            for (int k = 0; k < cs[i].reps; k++)
                cs[i].fn(cs[i].ctx);
            cs[i].samples[r] = (now() - t0) / cs[i].reps;
        }
    for (int i = 0; i < n; i++) {
        qsort(cs[i].samples, (size_t)rounds, sizeof(double), cmp_double);
        out[i] = cs[i].samples[rounds / 2];
    }
}

static float *X, *W, *Y;
static uint16_t *Wbf;

struct call {
    int M, N, K;
    kvg_tensor w;
    kvg_threadpool *tp;
    kvg_gemm_ws *ws;
};

static void run_openblas(void *arg)
{
    struct call *c = arg;
    cblas_sgemm(ROW_MAJOR, NO_TRANS, TRANS, c->M, c->N, c->K, 1.0f, X, c->K, W, c->K, 0.0f, Y, c->N);
}

static void run_kvgate(void *arg)
{
    struct call *c = arg;
    kvg_gemm(c->tp, c->ws, X, c->M, c->K, &c->w, NULL, Y);
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static void fill(void)
{
    uint64_t s = 12345;
    size_t nx = (size_t)MAX_M * MAX_DIM, nw = (size_t)MAX_DIM * MAX_DIM;
    X = malloc(nx * sizeof(float));
    W = malloc(nw * sizeof(float));
    Y = malloc((size_t)MAX_M * MAX_DIM * sizeof(float));
    Wbf = malloc(nw * sizeof(uint16_t));
    for (size_t i = 0; i < nx; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        X[i] = (float)((double)(s >> 40) / 8388608.0 - 1.0);
    }
    for (size_t i = 0; i < nw; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        W[i] = (float)((double)(s >> 40) / 8388608.0 - 1.0) * 0.05f;
        Wbf[i] = to_bf16(W[i]);
    }
}

static double gflops(int M, int N, int K, double sec)
{
    return 2.0 * M * N * K / sec / 1e9;
}

/* [shape][m][threads-1] */
static double ob_env[N_SHAPES][N_MS][2], ob_nat[N_SHAPES][N_MS][2], ob_child[N_SHAPES][N_MS][2];
static double kv_f32[N_SHAPES][N_MS][2], kv_bf16[N_SHAPES][N_MS][2];

static void measure_openblas(double out[N_SHAPES][N_MS][2])
{
    for (int t = 1; t <= 2; t++) {
        openblas_set_num_threads(t);
        for (int s = 0; s < N_SHAPES; s++)
            for (int mi = 0; mi < N_MS; mi++) {
                struct call c = { Ms[mi], shapes[s][0], shapes[s][1], { 0 }, NULL, NULL };
                contender cs[1] = { { run_openblas, &c, 0, { 0 } } };
                double sec;
                time_calls(cs, 1, &sec);
                out[s][mi][t - 1] = gflops(c.M, c.N, c.K, sec);
            }
    }
    openblas_set_num_threads(1);
}

/* OpenBLAS figures from this program run again in a child: with `native`, its
 * environment lacks OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE (OpenBLAS picks its own
 * kernels); without, it is this environment (used for 2 threads, because OpenBLAS's
 * workers keep spinning after a call and would slow whatever runs next in this
 * process). 0 on success. */
static int measure_child(int native, double out[N_SHAPES][N_MS][2], char *corename, size_t cap)
{
    int fds[2];
    pid_t pid;
    FILE *f;
    char line[256];
    int got = 0, status;

    if (pipe(fds) != 0)
        return -1;
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        char *args[] = { "gemm_bench", "--openblas-only", quick ? "--quick" : NULL, NULL };
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        if (native) {
            unsetenv("OPENBLAS_CORETYPE");
            unsetenv("OPENBLAS_L2_SIZE");
        }
        execv("/proc/self/exe", args);
        _exit(127);
    }
    close(fds[1]);
    f = fdopen(fds[0], "r");
    while (f && fgets(line, sizeof line, f)) {
        int s, mi, t;
        double g;
        char name[64];
        if (sscanf(line, "core %63s", name) == 1)
            snprintf(corename, cap, "%s", name);
        else if (sscanf(line, "ob %d %d %d %lf", &s, &mi, &t, &g) == 4 && s >= 0 &&
                 s < N_SHAPES && mi >= 0 && mi < N_MS && t >= 1 && t <= 2) {
            out[s][mi][t - 1] = g;
            got++;
        }
    }
    if (f)
        fclose(f);
    waitpid(pid, &status, 0);
    return got == N_SHAPES * N_MS * 2 ? 0 : -1;
}

static void invariance_demo(kvg_threadpool *tp, kvg_gemm_ws *ws)
{
    enum { N = 2048, K = 768, M = 64 };
    float *alone = malloc(N * sizeof(float));
    kvg_tensor w = { W, KVG_DT_F32, N, K };
    int ob = 0, kv = 0;

    openblas_set_num_threads(1);
    cblas_sgemm(ROW_MAJOR, NO_TRANS, TRANS, 1, N, K, 1.0f, X, K, W, K, 0.0f, alone, N);
    cblas_sgemm(ROW_MAJOR, NO_TRANS, TRANS, M, N, K, 1.0f, X, K, W, K, 0.0f, Y, N);
    for (int n = 0; n < N; n++)
        ob += memcmp(&alone[n], &Y[n], sizeof(float)) != 0;
    kvg_gemm(NULL, ws, X, 1, K, &w, NULL, alone);
    kvg_gemm(tp, ws, X, M, K, &w, NULL, Y);
    for (int n = 0; n < N; n++)
        kv += memcmp(&alone[n], &Y[n], sizeof(float)) != 0;
    printf("\nbatch invariance, %dx%d F32: outputs of row 0 that differ between M=%d and M=1 "
           "(of %d)\n  OpenBLAS (%s): %d\n  kvgate (%s, M=%d on 2 threads): %d\n",
           N, K, M, N, openblas_get_corename(), ob, kvg_gemm_isa(), M, kv);
    free(alone);
}

int main(int argc, char **argv)
{
    kvg_threadpool *pools[2];
    kvg_gemm_ws *ws;
    const char *ct = getenv("OPENBLAS_CORETYPE"), *l2 = getenv("OPENBLAS_L2_SIZE");
    char native_core[64] = "";
    int have_native;

    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
    fill();

    if (argc > 1 && strcmp(argv[1], "--openblas-only") == 0) {
        measure_openblas(ob_env);
        printf("core %s\n", openblas_get_corename());
        for (int s = 0; s < N_SHAPES; s++)
            for (int mi = 0; mi < N_MS; mi++)
                for (int t = 1; t <= 2; t++)
                    printf("ob %d %d %d %.3f\n", s, mi, t, ob_env[s][mi][t - 1]);
        return 0;
    }

    printf("kvg_gemm ISA: %s\n", kvg_gemm_isa());
    printf("OpenBLAS: %s; core %s (OPENBLAS_CORETYPE=%s, OPENBLAS_L2_SIZE=%s)\n",
           openblas_get_config(), openblas_get_corename(), ct ? ct : "(unset)",
           l2 ? l2 : "(unset)");
    fflush(stdout);

    openblas_set_num_threads(1);
    if (measure_child(0, ob_child, native_core, sizeof native_core) != 0)
        printf("OpenBLAS 2-thread run (child) failed\n");
    if (ct || l2) {
        have_native = measure_child(1, ob_nat, native_core, sizeof native_core) == 0;
        if (have_native)
            printf("OpenBLAS native (both variables unset, re-executed): core %s\n", native_core);
        else
            printf("OpenBLAS native: the re-executed run failed; ratios use the environment's\n");
    } else {
        have_native = 0;
        printf("OpenBLAS native = as run (neither variable is set)\n");
    }
    fflush(stdout);

    pools[0] = NULL;
    pools[1] = kvg_threadpool_new(2);
    /* Made once, as the CPU backend makes its own: every shape below fits. */
    ws = kvg_gemm_ws_new(2, 288, MAX_DIM);
    if (!ws || kvg_gemm_ws_reserve(ws, MAX_M) != 0) {
        fprintf(stderr, "gemm_bench: out of memory for the GEMM workspace\n");
        return 1;
    }
    for (int t = 1; t <= 2; t++)
        for (int s = 0; s < N_SHAPES; s++)
            for (int mi = 0; mi < N_MS; mi++) {
                int M = Ms[mi], N = shapes[s][0], K = shapes[s][1];
                struct call ob = { M, N, K, { 0 }, NULL, NULL };
                struct call f32 = { M, N, K, { W, KVG_DT_F32, N, K }, pools[t - 1], ws };
                struct call bf = { M, N, K, { Wbf, KVG_DT_BF16, N, K }, pools[t - 1], ws };
                /* One thread: OpenBLAS alternates with kvgate here; two: from the child. */
                contender cs[3] = { { run_kvgate, &f32, 0, { 0 } }, { run_kvgate, &bf, 0, { 0 } },
                                    { run_openblas, &ob, 0, { 0 } } };
                double sec[3];
                time_calls(cs, t == 1 ? 3 : 2, sec);
                kv_f32[s][mi][t - 1] = gflops(M, N, K, sec[0]);
                kv_bf16[s][mi][t - 1] = gflops(M, N, K, sec[1]);
                ob_env[s][mi][t - 1] = t == 1 ? gflops(M, N, K, sec[2]) : ob_child[s][mi][1];
            }
    if (!have_native)
        memcpy(ob_nat, ob_env, sizeof ob_nat);

    printf("\nGFLOP/s (median), Y[M][N] = X[M][K] W[N][K]^T; ratio = kvgate F32 / OpenBLAS native\n");
    printf("%4s %4s %4s %3s | %9s %9s | %9s %9s | %6s\n", "N", "K", "M", "thr", "kvg f32",
           "kvg bf16", "OB env", "OB nativ", "ratio");
    for (int t = 1; t <= 2; t++)
        for (int s = 0; s < N_SHAPES; s++)
            for (int mi = 0; mi < N_MS; mi++)
                printf("%4d %4d %4d %3d | %9.1f %9.1f | %9.1f %9.1f | %6.2f\n", shapes[s][0],
                       shapes[s][1], Ms[mi], t, kv_f32[s][mi][t - 1], kv_bf16[s][mi][t - 1],
                       ob_env[s][mi][t - 1], ob_nat[s][mi][t - 1],
                       kv_f32[s][mi][t - 1] / ob_nat[s][mi][t - 1]);

    invariance_demo(pools[1], ws);
    kvg_threadpool_free(pools[1]);
    kvg_gemm_ws_free(ws);
    free(X);
    free(W);
    free(Y);
    free(Wbf);
    return 0;
}
