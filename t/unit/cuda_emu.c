/* The CUDA emulation (kernels/emu/) itself: the execution model (blocks, barriers, warp
 * shuffles and votes, atomics, shared memory, launch validation), the runtime (memory
 * table and copy checks, the memory budget, streams, events, errors, fault injection, the
 * environment's device states), the BF16/F16 conversions against independent references,
 * and cuBLASLt against a naive GEMM. The kernels are in t/unit/cuda_emu_kernels.cu. */
#include <math.h>
#include <stdarg.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvg_cuda_api.h"
#include "tap.h"

cudaError_t emu_t_block_sum(const float *x, int n, int threads, float *out);
cudaError_t emu_t_dyn_reverse(const float *x, int blocks, int threads, float *out, int *aligned);
cudaError_t emu_t_warp_ops(int warps, const float *xf, const int *xi, float *fx, float *fd,
                           int *ix, int *id, float *h16, int *idx, int *up, unsigned *ballot,
                           int *anyall, unsigned *usum);
cudaError_t emu_t_atomics(int blocks, int threads, int *count, float *fsum,
                          unsigned long long *usum, unsigned *ucount, int *mx, int *mn,
                          int *claimed, int *exch, int *won, int *olds);
cudaError_t emu_t_indices(const unsigned g[3], const unsigned b[3], unsigned *out);
cudaError_t emu_t_config(const unsigned g[3], const unsigned b[3], size_t smem,
                         cudaStream_t s, int *flag);
cudaError_t emu_t_convert(const float *in, int n, unsigned short *bf, unsigned short *hf,
                          float *bf_back, float *hf_back);
cudaError_t emu_t_from_bits(const unsigned short *in, int n, float *bf, float *hf);
cudaError_t emu_t_partial_exit(int threads, int live, int *out);
void emu_t_divergent_sync(void);
void emu_t_deadlock(void);
cudaError_t emu_t_partial_warp(unsigned *out);
void emu_t_shfl_exited_lane(float *out);
cudaError_t emu_t_sync_loop(int blocks, int threads, int iters, int *out);

__attribute__((format(printf, 1, 2), noreturn))
static void bail(const char *fmt, ...)
{
    va_list ap;
    printf("Bail out! ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    exit(255);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* Device buffer with host contents. */
static void *dev_from(const void *host, size_t bytes)
{
    void *d = NULL;
    if (cudaMalloc(&d, bytes) != cudaSuccess || cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice))
        bail("cudaMalloc/cudaMemcpy of %zu bytes failed", bytes);
    return d;
}

static void to_host(void *host, const void *dev, size_t bytes)
{
    if (cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
        bail("cudaMemcpy back failed");
}

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void test_block_sum(void)
{
    enum { N = 1000, T = 256 };
    float x[N], out[4];
    for (int i = 0; i < N; i++)
        x[i] = (float)(i % 17) - 8.0f;
    float *dx = dev_from(x, sizeof x), *dout;
    cudaMalloc((void **)&dout, sizeof out);
    is_int(emu_t_block_sum(dx, N, T, dout), cudaSuccess, "block reduction launches");
    to_host(out, dout, sizeof out);
    int good = 1;
    for (int b = 0; b < 4; b++) {
        float want = 0;
        for (int i = b * T; i < (b + 1) * T && i < N; i++)
            want += x[i];
        good &= out[b] == want;
    }
    ok(good, "block reduction with __syncthreads and static shared memory: 4 blocks");
    cudaFree(dx);
    cudaFree(dout);
}

static void test_dyn_smem(void)
{
    enum { B = 3, T = 64 };
    float x[B * T], out[B * T];
    int aligned[B];
    for (int i = 0; i < B * T; i++)
        x[i] = (float)i;
    float *dx = dev_from(x, sizeof x), *dout;
    int *daligned;
    cudaMalloc((void **)&dout, sizeof out);
    cudaMalloc((void **)&daligned, sizeof aligned);
    is_int(emu_t_dyn_reverse(dx, B, T, dout, daligned), cudaSuccess,
           "dynamic shared memory launch");
    to_host(out, dout, sizeof out);
    to_host(aligned, daligned, sizeof aligned);
    int good = 1;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            good &= out[b * T + t] == x[b * T + T - 1 - t];
    ok(good, "dynamic shared memory: each block reverses its slice");
    ok(aligned[0] && aligned[1] && aligned[2], "dynamic shared memory is 16-byte aligned");
    cudaFree(dx);
    cudaFree(dout);
    cudaFree(daligned);
}

static void test_warps(void)
{
    enum { W = 4, N = W * 32 };
    float xf[N], fx[N], fd[W], h16[N];
    int xi[N], ix[N], id[W], idx[N], up[N], anyall[W];
    unsigned ballot[W], usum[W];
    for (int i = 0; i < N; i++) {
        xf[i] = (float)(int)(rnd() % 64) * 0.25f;
        xi[i] = (int)(rnd() % 100) - 30;
    }
    for (int i = 32; i < 64; i++)      /* warp 1: all positive */
        xi[i] = i;
    for (int i = 64; i < 96; i++)      /* warp 2: none positive */
        xi[i] = -i;
    float *dxf = dev_from(xf, sizeof xf), *dfx, *dfd, *dh16;
    int *dxi = dev_from(xi, sizeof xi), *dix, *did, *didx, *dup, *danyall;
    unsigned *dballot, *dusum;
    cudaMalloc((void **)&dfx, sizeof fx);
    cudaMalloc((void **)&dfd, sizeof fd);
    cudaMalloc((void **)&dh16, sizeof h16);
    cudaMalloc((void **)&dix, sizeof ix);
    cudaMalloc((void **)&did, sizeof id);
    cudaMalloc((void **)&didx, sizeof idx);
    cudaMalloc((void **)&dup, sizeof up);
    cudaMalloc((void **)&danyall, sizeof anyall);
    cudaMalloc((void **)&dballot, sizeof ballot);
    cudaMalloc((void **)&dusum, sizeof usum);
    is_int(emu_t_warp_ops(W, dxf, dxi, dfx, dfd, dix, did, dh16, didx, dup, dballot, danyall,
                          dusum), cudaSuccess, "warp operations launch");
    to_host(fx, dfx, sizeof fx);
    to_host(fd, dfd, sizeof fd);
    to_host(h16, dh16, sizeof h16);
    to_host(ix, dix, sizeof ix);
    to_host(id, did, sizeof id);
    to_host(idx, didx, sizeof idx);
    to_host(up, dup, sizeof up);
    to_host(anyall, danyall, sizeof anyall);
    to_host(ballot, dballot, sizeof ballot);
    to_host(usum, dusum, sizeof usum);
    int g_fx = 1, g_fd = 1, g_ix = 1, g_id = 1, g_h = 1, g_idx = 1, g_up = 1, g_b = 1, g_aa = 1,
        g_u = 1;
    for (int w = 0; w < W; w++) {
        /* quarter-integers of small size: every order of summation is exact */
        float fs = 0, hs[2] = {0, 0};
        int is = 0;
        unsigned us = 0, b = 0;
        for (int l = 0; l < 32; l++) {
            fs += xf[w * 32 + l];
            hs[l / 16] += xf[w * 32 + l];
            is += xi[w * 32 + l];
            us += (unsigned)xi[w * 32 + l] * 3u;
            if (xi[w * 32 + l] > 0)
                b |= 1u << l;
        }
        g_fd &= fd[w] == fs;
        g_id &= id[w] == is;
        g_u &= usum[w] == us;
        g_b &= ballot[w] == b;
        g_aa &= anyall[w] == (b != 0) + 2 * (b == 0xffffffffu);
        for (int l = 0; l < 32; l++) {
            int t = w * 32 + l;
            g_fx &= fx[t] == fs;
            g_ix &= ix[t] == is;
            g_h &= h16[t] == hs[l / 16];
            g_idx &= idx[t] == xi[w * 32 + 3];
            g_up &= up[t] == (l == 0 ? xi[t] : xi[t - 1]);
        }
    }
    ok(g_fx, "__shfl_xor_sync reduction, float: every lane has the warp's sum");
    ok(g_ix, "__shfl_xor_sync reduction, int");
    ok(g_u, "__shfl_xor_sync reduction, unsigned");
    ok(g_fd, "__shfl_down_sync reduction, float: lane 0 has the warp's sum");
    ok(g_id, "__shfl_down_sync reduction, int");
    ok(g_h, "__shfl_xor_sync with width 16 reduces each half-warp");
    ok(g_idx, "__shfl_sync reads the named lane");
    ok(g_up, "__shfl_up_sync reads lane - delta, lane 0 keeps its value");
    ok(g_b, "__ballot_sync");
    ok(g_aa, "__any_sync and __all_sync (mixed, all, none)");
    cudaFree(dxf); cudaFree(dfx); cudaFree(dfd); cudaFree(dh16); cudaFree(dxi); cudaFree(dix);
    cudaFree(did); cudaFree(didx); cudaFree(dup); cudaFree(danyall); cudaFree(dballot);
    cudaFree(dusum);
}

static void test_atomics(void)
{
    enum { B = 5, T = 96 };
    struct {
        int count;
        float fsum;
        unsigned long long usum;
        unsigned ucount;
        int mx, mn, claimed, exch;
    } h = {0, 0.0f, 0, 0, -1, 1, -1, -1}, *d;
    int n = B * T, *dwon, *dolds;
    int *won = calloc((size_t)n, sizeof *won), *olds = calloc((size_t)n, sizeof *olds);
    unsigned char *seen = calloc((size_t)n + 1, 1);
    d = dev_from(&h, sizeof h);
    cudaMalloc((void **)&dwon, (size_t)n * sizeof *dwon);
    cudaMalloc((void **)&dolds, (size_t)n * sizeof *dolds);
    is_int(emu_t_atomics(B, T, &d->count, &d->fsum, &d->usum, &d->ucount, &d->mx, &d->mn,
                         &d->claimed, &d->exch, dwon, dolds), cudaSuccess, "atomics launch");
    to_host(&h, d, sizeof h);
    to_host(won, dwon, (size_t)n * sizeof *won);
    to_host(olds, dolds, (size_t)n * sizeof *olds);
    is_int(h.count, n, "atomicAdd int across blocks");
    ok(h.fsum == 0.5f * (float)n, "atomicAdd float across blocks");
    is_int(h.usum, (long long)n * (n - 1) / 2, "atomicAdd unsigned long long");
    is_int(h.ucount, 2 * n, "atomicAdd unsigned");
    is_int(h.mx, n - 1, "atomicMax");
    is_int(h.mn, -(n - 1), "atomicMin");
    /* The threads run in a random order: which thread wins is not fixed, that one does. */
    int winners = 0, winner = -2;
    for (int i = 0; i < n; i++)
        if (won[i]) {
            winners++;
            winner = i;
        }
    ok(winners == 1 && h.claimed == winner, "atomicCAS: exactly one thread claims the slot, and the "
       "slot holds its id (%d winners, slot %d)", winners, h.claimed);
    /* The exchanges form one chain: the old values and the final one are -1 and every
     * thread's id, each exactly once. */
    int chain = h.exch >= 0 && h.exch < n;
    if (chain)
        seen[h.exch + 1] = 1;
    for (int i = 0; i < n && chain; i++) {
        chain = olds[i] >= -1 && olds[i] < n && !seen[olds[i] + 1];
        if (chain)
            seen[olds[i] + 1] = 1;
    }
    ok(chain, "atomicExch: each thread got the value of the one before it (one chain)");
    free(won);
    free(olds);
    free(seen);
    cudaFree(dwon);
    cudaFree(dolds);
    cudaFree(d);
}

static void test_indices(void)
{
    unsigned g[3] = {3, 2, 2}, b[3] = {4, 3, 2};
    unsigned threads = 24, blocks = 12, n = threads * blocks;
    unsigned *out = calloc((size_t)n * 12, sizeof *out), *dout;
    cudaMalloc((void **)&dout, (size_t)n * 12 * sizeof *out);
    is_int(emu_t_indices(g, b, dout), cudaSuccess, "3-D launch");
    to_host(out, dout, (size_t)n * 12 * sizeof *out);
    int good = 1;
    for (unsigned bz = 0; bz < 2; bz++)
        for (unsigned by = 0; by < 2; by++)
            for (unsigned bx = 0; bx < 3; bx++)
                for (unsigned tz = 0; tz < 2; tz++)
                    for (unsigned ty = 0; ty < 3; ty++)
                        for (unsigned tx = 0; tx < 4; tx++) {
                            unsigned blk = (bz * 2 + by) * 3 + bx, th = (tz * 3 + ty) * 4 + tx;
                            unsigned *o = out + (size_t)(blk * threads + th) * 12;
                            unsigned want[12] = {bx, by, bz, tx, ty, tz, 3, 2, 2, 4, 3, 2};
                            good &= memcmp(o, want, sizeof want) == 0;
                        }
    ok(good, "3-D grid of 3-D blocks: every thread sees its indices and the dimensions");
    cudaFree(dout);
    free(out);

    /* a 1-D grid of many blocks, and a 2-D one */
    unsigned g1[3] = {70, 1, 1}, b1[3] = {64, 1, 1};
    n = 70 * 64;
    out = calloc((size_t)n * 12, sizeof *out);
    cudaMalloc((void **)&dout, (size_t)n * 12 * sizeof *out);
    is_int(emu_t_indices(g1, b1, dout), cudaSuccess, "70-block launch");
    to_host(out, dout, (size_t)n * 12 * sizeof *out);
    good = 1;
    for (unsigned i = 0; i < n; i++)
        good &= out[i * 12] == i / 64 && out[i * 12 + 3] == i % 64 && out[i * 12 + 6] == 70;
    ok(good, "a grid of 70 blocks runs every block");
    cudaFree(dout);
    free(out);
}

static void test_config(void)
{
    int *flag, one = 0;
    cudaMalloc((void **)&flag, sizeof *flag);
    cudaMemset(flag, 0, sizeof *flag);
    struct {
        unsigned g[3], b[3];
        size_t smem;
        cudaError_t want;
        const char *what;
    } cases[] = {
        {{1, 1, 1}, {1025, 1, 1}, 0, cudaErrorInvalidConfiguration, "1025 threads"},
        {{1, 1, 1}, {32, 32, 2}, 0, cudaErrorInvalidConfiguration, "32x32x2 threads"},
        {{1, 1, 1}, {1, 1, 65}, 0, cudaErrorInvalidConfiguration, "block z 65"},
        {{0, 1, 1}, {32, 1, 1}, 0, cudaErrorInvalidConfiguration, "grid x 0"},
        {{1, 1, 1}, {0, 1, 1}, 0, cudaErrorInvalidConfiguration, "block x 0"},
        {{1, 65536, 1}, {1, 1, 1}, 0, cudaErrorInvalidConfiguration, "grid y 65536"},
        {{1, 1, 1}, {32, 1, 1}, (48 << 10) + 1, cudaErrorInvalidValue, "48 KiB + 1 of smem"},
        {{1, 1, 1}, {1024, 1, 1}, 48 << 10, cudaSuccess, "1024 threads, 48 KiB of smem"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        is_int(emu_t_config(cases[i].g, cases[i].b, cases[i].smem, NULL, flag), cases[i].want,
               "launch with %s", cases[i].what);
    to_host(&one, flag, sizeof one);
    is_int(one, 1, "only the valid launch ran");
    is_int(cudaGetLastError(), cudaSuccess, "cudaGetLastError cleared the launch error");

    unsigned g1[3] = {1, 1, 1};
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaStreamDestroy(s);
    is_int(emu_t_config(g1, g1, 0, s, flag), cudaErrorInvalidResourceHandle,
           "launch on a destroyed stream");

    pid_t pid;
    int status;
    float *fbuf;
    cudaMalloc((void **)&fbuf, 32 * sizeof *fbuf);
    /* the bugs: run in a child, which must abort with a message naming the kernel */
    for (int which = 0; which < 3; which++) {
        int fds[2];
        if (pipe(fds))
            bail("pipe");
        fflush(stdout);
        pid = fork();
        if (pid == 0) {
            dup2(fds[1], 2);
            close(fds[0]);
            if (which == 0)
                emu_t_divergent_sync();
            else if (which == 1)
                emu_t_shfl_exited_lane(fbuf);
            else
                emu_t_deadlock();
            cudaDeviceSynchronize();         /* the launch runs when the host waits for it */
            _exit(0);
        }
        close(fds[1]);
        char msg[2048] = "";
        size_t len = 0;
        ssize_t r;
        while ((r = read(fds[0], msg + len, sizeof msg - 1 - len)) > 0)
            len += (size_t)r;
        msg[len] = 0;
        close(fds[0]);
        waitpid(pid, &status, 0);
        static const char *const what[3] = {"__syncthreads at different places",
                                            "a shuffle reading an exited lane",
                                            "half a warp in __syncthreads, half in __syncwarp"};
        static const char *const kernel[3] = {"emu_t_divergent_sync", "emu_t_shfl_exited_lane",
                                              "emu_t_deadlock"};
        static const char *const says[3] = {"different __syncthreads", "lane 5 has exited",
                                            "deadlock"};
        ok(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "%s aborts", what[which]);
        ok(strstr(msg, kernel[which]) && strstr(msg, says[which]),
           "the message names the kernel and the bug");
        if (!strstr(msg, "kvg-emu"))
            diag("child said: %s", msg);
    }
    cudaFree(fbuf);
    cudaFree(flag);
}

static void test_partial_exit(void)
{
    enum { T = 64, LIVE = 40 };
    int out[T], *dout;
    cudaMalloc((void **)&dout, sizeof out);
    cudaMemset(dout, 0xff, sizeof out);
    is_int(emu_t_partial_exit(T, LIVE, dout), cudaSuccess, "partial exit launch");
    to_host(out, dout, sizeof out);
    int good = 1;
    for (int t = 0; t < LIVE; t++)
        good &= out[t] == ((t + 1) % LIVE) * 10;
    for (int t = LIVE; t < T; t++)
        good &= out[t] == -1;
    ok(good, "threads that exited do not hold up __syncthreads");
    cudaFree(dout);

    unsigned pw[48], *dpw;
    cudaMalloc((void **)&dpw, sizeof pw);
    is_int(emu_t_partial_warp(dpw), cudaSuccess, "partial warp launch");
    to_host(pw, dpw, 44 * sizeof *pw);
    unsigned odd = 0;
    for (int l = 1; l < 31; l += 2)
        odd |= 1u << l;
    ok(pw[0] == (odd | 1u << 31), "full-mask ballot and all in a full warp");
    ok(pw[32] == ((odd & 0xfffu) | 1u << 31),
       "full-mask ballot and all count only the live lanes of a partial warp");
    good = 1;
    for (unsigned t = 1; t < 44; t++)
        if (t != 32)
            good &= pw[t] == 4 * (t & ~3u) + 6;
    ok(good, "width-4 shuffles among the live lanes");
    cudaFree(dpw);
}

/* ---- conversions ---- */

/* F16 value of bits h by its definition (independent of the emulator's code). */
static double f16_value(unsigned h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double s = h & 0x8000 ? -1.0 : 1.0;
    if (e == 31)
        return m ? NAN : s * INFINITY;
    if (e == 0)
        return s * ldexp(m, -24);
    return s * ldexp(1024 + m, e - 25);
}

/* The F16 nearest to x, ties to even, by search over the finite values. */
static unsigned f16_nearest(float xf)
{
    double x = xf;
    if (isnan(x))
        return 0x7e00;
    unsigned sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    if (a >= 65520.0)
        return sign | 0x7c00;
    unsigned lo = 0, hi = 0x7bff;     /* largest finite <= a */
    while (lo < hi) {
        unsigned mid = (lo + hi + 1) / 2;
        if (f16_value(mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (lo == 0x7bff)
        return sign | lo;             /* 65504 <= a < 65520 */
    double d0 = a - f16_value(lo), d1 = f16_value(lo + 1) - a;
    unsigned r = d0 < d1 ? lo : d1 < d0 ? lo + 1 : (lo & 1 ? lo + 1 : lo);
    return sign | r;
}

/* The BF16 nearest to x, ties to even, by comparing the two candidates in double. */
static unsigned bf16_nearest(float x)
{
    uint32_t u = f_bits(x);
    if (isnan(x))
        return 0x7fc0;
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    double dl = fabs((double)x - (double)bits_f(lo));
    if ((lo & 0x7fffffffu) == 0x7f800000u)
        return lo >> 16;              /* x is infinite */
    /* past the largest BF16 the next step up is 2^128, i.e. infinity */
    double dh = (hi & 0x7fffffffu) == 0x7f800000u ? ldexp(1.0, 128) - fabs((double)x)
                                                  : fabs((double)bits_f(hi) - (double)x);
    if (dl < dh)
        return lo >> 16;
    if (dh < dl)
        return hi >> 16;
    return (lo >> 16) & 1 ? hi >> 16 : lo >> 16;
}

static void test_conversions(void)
{
    /* every F16 and BF16 bit pattern back to float */
    enum { NB = 65536 };
    unsigned short *bits = malloc(NB * sizeof *bits);
    float *bfv = malloc(NB * sizeof *bfv), *hfv = malloc(NB * sizeof *hfv);
    for (int i = 0; i < NB; i++)
        bits[i] = (unsigned short)i;
    unsigned short *dbits = dev_from(bits, NB * sizeof *bits);
    float *dbf, *dhf;
    cudaMalloc((void **)&dbf, NB * sizeof *dbf);
    cudaMalloc((void **)&dhf, NB * sizeof *dhf);
    is_int(emu_t_from_bits(dbits, NB, dbf, dhf), cudaSuccess, "conversion from bits launches");
    to_host(bfv, dbf, NB * sizeof *bfv);
    to_host(hfv, dhf, NB * sizeof *hfv);
    int gb = 1, gh = 1;
    for (int i = 0; i < NB; i++) {
        gb &= f_bits(bfv[i]) == (uint32_t)i << 16;
        double want = f16_value((unsigned)i);
        gh &= isnan(want) ? isnan(hfv[i]) : (double)hfv[i] == want && !!signbit(hfv[i]) == (i >> 15);
    }
    ok(gb, "__bfloat162float of every BF16");
    ok(gh, "__half2float of every F16 (subnormals, infinities, NaNs)");

    /* floats: hand-checked constants, every F16 midpoint and its neighbours, randoms */
    enum { NF = 4 * 31744 + 20000 + 16 };
    float *in = malloc(NF * sizeof *in);
    int n = 0;
    const float hand[16] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65519.99f, 65520.0f, 1e10f,
                            0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x1.8p-24f, 0x1p-14f,
                            INFINITY, -INFINITY, 3.14159265f};
    for (int i = 0; i < 16; i++)
        in[n++] = hand[i];
    for (unsigned h = 0; h < 31744; h++) {       /* positive finite F16s */
        float mid = (float)((f16_value(h) + f16_value(h + 1)) / 2);
        in[n++] = mid;
        in[n++] = nextafterf(mid, 0.0f);
        in[n++] = nextafterf(mid, INFINITY);
        in[n++] = -mid;
    }
    while (n < NF) {
        uint32_t u = rnd() | (rnd() & 1u) << 31;
        if (rnd() % 4 == 0)
            u = (u & 0xffff0000u) | 0x8000u;     /* BF16 ties */
        in[n++] = bits_f(u);
    }
    float *din = dev_from(in, NF * sizeof *in), *dbb, *dhb;
    unsigned short *dbo, *dho, *bo = malloc(NF * sizeof *bo), *ho = malloc(NF * sizeof *ho);
    float *bb = malloc(NF * sizeof *bb), *hb = malloc(NF * sizeof *hb);
    cudaMalloc((void **)&dbo, NF * sizeof *bo);
    cudaMalloc((void **)&dho, NF * sizeof *ho);
    cudaMalloc((void **)&dbb, NF * sizeof *bb);
    cudaMalloc((void **)&dhb, NF * sizeof *hb);
    is_int(emu_t_convert(din, NF, dbo, dho, dbb, dhb), cudaSuccess, "conversion launches");
    to_host(bo, dbo, NF * sizeof *bo);
    to_host(ho, dho, NF * sizeof *ho);
    to_host(bb, dbb, NF * sizeof *bb);
    to_host(hb, dhb, NF * sizeof *hb);
    int bad_b = 0, bad_h = 0, bad_pair = 0;
    for (int i = 0; i < NF; i++) {
        unsigned wb = bf16_nearest(in[i]), wh = f16_nearest(in[i]);
        if (isnan(in[i])) {
            /* a NaN stays a NaN, quiet, with its sign */
            int sb = (bo[i] & 0x7f80) == 0x7f80 && (bo[i] & 0x40) && (bo[i] >> 15) == (f_bits(in[i]) >> 31);
            int sh = (ho[i] & 0x7c00) == 0x7c00 && (ho[i] & 0x200) && (ho[i] >> 15) == (f_bits(in[i]) >> 31);
            bad_b += !sb;
            bad_h += !sh;
            continue;
        }
        if (bo[i] != wb && bad_b++ < 3)
            diag("bf16(%a) = 0x%04x, expected 0x%04x", (double)in[i], bo[i], wb);
        if (ho[i] != wh && bad_h++ < 3)
            diag("f16(%a) = 0x%04x, expected 0x%04x", (double)in[i], ho[i], wh);
        bad_pair += f_bits(bb[i]) != (uint32_t)bo[i] << 16 || (double)hb[i] != f16_value(ho[i]);
    }
    is_int(bad_b, 0, "__float2bfloat16: round to nearest even, NaN quiet (%d values)", NF);
    is_int(bad_h, 0, "__float2half: round to nearest even, subnormals, overflow (%d values)", NF);
    is_int(bad_pair, 0, "the pair conversions agree with the single ones");
    /* a few by hand */
    is_int(ho[6], 0x7c00, "65520 -> F16 infinity");
    is_int(ho[5], 0x7bff, "65519.99 -> 65504");
    is_int(ho[8], 0x0001, "2^-24 -> the least F16 subnormal");
    is_int(ho[9], 0x0000, "2^-25 (a tie) -> 0");
    is_int(ho[10], 0x0001, "just above 2^-25 -> the least subnormal");
    is_int(ho[11], 0x0002, "1.5 * 2^-24 (a tie) -> 2 * 2^-24 (even)");
    is_int(bo[15], 0x4049, "pi -> BF16 0x4049");
    is_int(ho[15], 0x4248, "pi -> F16 0x4248");
#ifdef __FLT16_MAX__
    {
        /* and against the compiler's own _Float16 conversion */
        int bad = 0;
        for (int i = 0; i < NF; i++) {
            if (isnan(in[i]))
                continue;
            _Float16 h = (_Float16)in[i];
            unsigned short hbits;
            memcpy(&hbits, &h, sizeof hbits);
            bad += hbits != ho[i];
        }
        is_int(bad, 0, "__float2half agrees with the compiler's _Float16");
    }
#endif
    cudaFree(dbits); cudaFree(dbf); cudaFree(dhf); cudaFree(din); cudaFree(dbo);
    cudaFree(dho); cudaFree(dbb); cudaFree(dhb);
    free(bits); free(bfv); free(hfv); free(in); free(bo); free(ho); free(bb); free(hb);
}

/* ---- the runtime ---- */

static void test_memory(void)
{
    size_t base = kvg_emu_bytes_in_use();
    char host[256], back[256];
    for (int i = 0; i < 256; i++)
        host[i] = (char)i;
    char *d = NULL, *pinned = NULL;
    is_int(cudaMalloc((void **)&d, 256), cudaSuccess, "cudaMalloc");
    ok(((uintptr_t)d & 255) == 0, "device allocations are 256-byte aligned");
    is_int(cudaMallocHost((void **)&pinned, 256), cudaSuccess, "cudaMallocHost");
    is_int(kvg_emu_bytes_in_use(), base + 512, "bytes in use count both");
    is_int(cudaMemcpy(back, d, 256, cudaMemcpyDeviceToHost), cudaSuccess, "D2H");
    int all_ff = 1;
    for (int i = 0; i < 256; i++)
        all_ff &= (unsigned char)back[i] == 0xff;
    ok(all_ff, "fresh device memory is 0xFF bytes (NaN as floats)");
    is_int(cudaMemcpy(d, host, 256, cudaMemcpyHostToDevice), cudaSuccess, "H2D");
    is_int(cudaMemcpy(d + 128, d, 128, cudaMemcpyDeviceToDevice), cudaSuccess, "D2D inside");
    is_int(cudaMemcpy(pinned, d, 256, cudaMemcpyDefault), cudaSuccess, "default kind: D2H");
    ok(memcmp(pinned, host, 128) == 0 && memcmp(pinned + 128, host, 128) == 0, "data arrived");
    is_int(cudaMemcpy(host, d, 256, cudaMemcpyHostToDevice), cudaErrorInvalidValue,
           "H2D with a host destination");
    is_int(cudaGetLastError(), cudaErrorInvalidValue, "cudaGetLastError reports it");
    is_int(cudaGetLastError(), cudaSuccess, "and clears it");
    is_int(cudaMemcpy(d, host, 256, cudaMemcpyDeviceToHost), cudaErrorInvalidValue,
           "D2H with a host source");
    is_int(cudaMemcpy(d + 1, host, 256, cudaMemcpyHostToDevice), cudaErrorInvalidValue,
           "H2D running past the allocation");
    is_int(cudaMemcpy(back, host, 256, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue,
           "D2D with host pointers");
    is_int(cudaMemcpy(back, pinned, 256, cudaMemcpyHostToHost), cudaSuccess,
           "H2H from pinned memory");
    is_int(cudaMemcpy(d, host, 16, (enum cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection,
           "a bad kind");
    is_int(cudaMemcpyAsync(back, d + 64, 64, cudaMemcpyDeviceToHost, NULL), cudaSuccess,
           "cudaMemcpyAsync from an interior pointer");
    ok(memcmp(back, host + 64, 64) == 0, "async data arrived");
    is_int(cudaMemset(d, 7, 256), cudaSuccess, "cudaMemset");
    is_int(cudaMemset(d, 7, 257), cudaErrorInvalidValue, "cudaMemset past the end");
    is_int(cudaMemset(host, 7, 16), cudaErrorInvalidValue, "cudaMemset of host memory");
    is_int(cudaMemsetAsync(d + 8, 0, 8, NULL), cudaSuccess, "cudaMemsetAsync");
    is_int(cudaFree(d + 1), cudaErrorInvalidValue, "cudaFree of an interior pointer");
    is_int(cudaFree(host), cudaErrorInvalidValue, "cudaFree of a host pointer");
    is_int(cudaFree(pinned), cudaErrorInvalidValue, "cudaFree of pinned memory");
    is_int(cudaFreeHost(d), cudaErrorInvalidValue, "cudaFreeHost of device memory");
    is_int(cudaFree(NULL), cudaSuccess, "cudaFree(NULL)");
    is_int(cudaFree(d), cudaSuccess, "cudaFree");
    is_int(cudaFreeHost(pinned), cudaSuccess, "cudaFreeHost");
    is_int(kvg_emu_bytes_in_use(), base, "everything freed");
    cudaGetLastError();

    /* the budget */
    setenv("KVG_EMU_MEMORY", "1M", 1);
    kvg_emu_reset();
    size_t fr = 0, total = 0;
    is_int(cudaMemGetInfo(&fr, &total), cudaSuccess, "cudaMemGetInfo");
    is_int(total, 1 << 20, "total is KVG_EMU_MEMORY");
    void *a = NULL, *b = NULL;
    is_int(cudaMalloc(&a, 600 << 10), cudaSuccess, "600 KiB of 1 MiB");
    cudaMemGetInfo(&fr, &total);
    is_int(fr, (1 << 20) - (600 << 10), "free shrinks");
    is_int(cudaMalloc(&b, 600 << 10), cudaErrorMemoryAllocation, "another 600 KiB fails");
    ok(b == NULL, "and returns NULL");
    is_int(cudaFree(a), cudaSuccess, "free it");
    is_int(cudaMalloc(&b, 600 << 10), cudaSuccess, "now it fits");
    cudaFree(b);
    struct cudaDeviceProp p;
    is_int(cudaGetDeviceProperties(&p, 0), cudaSuccess, "cudaGetDeviceProperties");
    is_str(p.name, "kvgate emulated device (host)", "device name");
    ok(p.major == 9 && p.minor == 0 && p.multiProcessorCount == 132 && p.warpSize == 32 &&
       p.maxThreadsPerBlock == 1024 && p.totalGlobalMem == 1 << 20 &&
       p.sharedMemPerBlock == 48 << 10, "device properties");
    unsetenv("KVG_EMU_MEMORY");
    kvg_emu_reset();
}

static void test_streams_events(void)
{
    cudaStream_t s1, s2;
    cudaEvent_t e1, e2, e3;
    is_int(cudaStreamCreate(&s1), cudaSuccess, "cudaStreamCreate");
    is_int(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess,
           "cudaStreamCreateWithFlags");
    is_int(cudaEventCreate(&e1), cudaSuccess, "cudaEventCreate");
    is_int(cudaEventCreate(&e2), cudaSuccess, "cudaEventCreate");
    is_int(cudaEventCreateWithFlags(&e3, cudaEventDisableTiming), cudaSuccess,
           "cudaEventCreateWithFlags");
    float ms = -1;
    is_int(cudaEventElapsedTime(&ms, e1, e2), cudaErrorInvalidResourceHandle,
           "elapsed time of unrecorded events");
    is_int(cudaEventRecord(e1, s1), cudaSuccess, "cudaEventRecord");
    is_int(cudaEventRecord(e2, s2), cudaSuccess, "cudaEventRecord");
    is_int(cudaEventSynchronize(e2), cudaSuccess, "cudaEventSynchronize");
    /* s1 and s2 are not ordered: e1 may not have completed yet */
    is_int(cudaEventQuery(e1), cudaErrorNotReady, "an event its stream has not reached is not ready");
    is_int(cudaEventElapsedTime(&ms, e1, e2), cudaErrorNotReady,
           "elapsed time with an incomplete event: not ready");
    is_int(cudaEventSynchronize(e1), cudaSuccess, "cudaEventSynchronize");
    is_int(cudaEventQuery(e1), cudaSuccess, "then it is");
    /* two records on one stream: in order, so waiting for the second waits for both */
    is_int(cudaEventRecord(e1, s1), cudaSuccess, "cudaEventRecord");
    is_int(cudaEventRecord(e2, s1), cudaSuccess, "cudaEventRecord");
    is_int(cudaEventSynchronize(e2), cudaSuccess, "cudaEventSynchronize");
    is_int(cudaEventElapsedTime(&ms, e1, e2), cudaSuccess, "cudaEventElapsedTime");
    ok(ms >= 0, "non-negative elapsed time");
    is_int(cudaEventElapsedTime(&ms, e1, e3), cudaErrorInvalidResourceHandle,
           "elapsed time with a no-timing event");
    is_int(cudaStreamSynchronize(s1), cudaSuccess, "cudaStreamSynchronize");
    is_int(cudaDeviceSynchronize(), cudaSuccess, "cudaDeviceSynchronize");
    is_int(cudaStreamDestroy(s1), cudaSuccess, "cudaStreamDestroy");
    is_int(cudaStreamDestroy(s1), cudaErrorInvalidResourceHandle, "destroying it twice");
    is_int(cudaStreamSynchronize(s1), cudaErrorInvalidResourceHandle, "a destroyed stream");
    cudaStreamDestroy(s2);
    cudaEventDestroy(e1);
    cudaEventDestroy(e2);
    cudaEventDestroy(e3);
    cudaGetLastError();
}

static void test_environment(void)
{
    int n = -1, v = 0;
    is_int(cudaGetDeviceCount(&n), cudaSuccess, "cudaGetDeviceCount");
    is_int(n, 1, "one device");
    is_int(cudaSetDevice(1), cudaErrorInvalidDevice, "cudaSetDevice(1)");
    is_int(cudaSetDevice(0), cudaSuccess, "cudaSetDevice(0)");
    is_int(cudaGetDevice(&v), cudaSuccess, "cudaGetDevice");
    is_int(cudaDriverGetVersion(&v), cudaSuccess, "cudaDriverGetVersion");
    is_int(v, 13000, "driver 13.0");
    is_int(cudaRuntimeGetVersion(&v), cudaSuccess, "cudaRuntimeGetVersion");
    is_int(v, 13000, "runtime 13.0");
    is_str(cudaGetErrorName(cudaErrorNoDevice), "cudaErrorNoDevice", "cudaGetErrorName");
    is_str(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory", "cudaGetErrorString");
    cudaGetLastError();

    setenv("KVG_EMU_DEVICES", "0", 1);
    kvg_emu_reset();
    n = -1;
    is_int(cudaGetDeviceCount(&n), cudaErrorNoDevice, "KVG_EMU_DEVICES=0: no device");
    is_int(n, 0, "count 0");
    void *p = NULL;
    is_int(cudaMalloc(&p, 16), cudaErrorNoDevice, "cudaMalloc without a device");
    unsigned g[3] = {1, 1, 1};
    is_int(emu_t_config(g, g, 0, NULL, NULL), cudaErrorNoDevice, "a launch without a device");
    cublasLtHandle_t h;
    is_int(cublasLtCreate(&h), CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtCreate without a device");
    unsetenv("KVG_EMU_DEVICES");

    setenv("KVG_EMU_DRIVER", "old", 1);
    kvg_emu_reset();
    is_int(cudaGetDeviceCount(&n), cudaErrorInsufficientDriver, "KVG_EMU_DRIVER=old");
    is_int(cudaSetDevice(0), cudaErrorInsufficientDriver, "every call says so");
    cudaDriverGetVersion(&v);
    ok(v < 13000, "the old driver's version is older (%d)", v);
    unsetenv("KVG_EMU_DRIVER");
    kvg_emu_reset();
    is_int(cudaGetDeviceCount(&n), cudaSuccess, "kvg_emu_reset re-reads the environment");
}

static void test_faults(void)
{
    void *a = NULL, *b = NULL, *c = NULL;
    kvg_emu_fail("cudaMalloc", 2, 0);
    is_int(cudaMalloc(&a, 16), cudaSuccess, "1st cudaMalloc");
    is_int(cudaMalloc(&b, 16), cudaErrorMemoryAllocation, "2nd fails as injected");
    is_int(cudaMalloc(&c, 16), cudaSuccess, "3rd works again (not sticky)");
    cudaFree(a);
    cudaFree(c);
    kvg_emu_fail("cudaMemcpyAsync", 1, cudaErrorLaunchFailure);
    char x[4] = {0};
    is_int(cudaMemcpyAsync(x, x, 4, cudaMemcpyHostToHost, NULL), cudaErrorLaunchFailure,
           "an injected error code");
    unsigned g[3] = {1, 1, 1};
    int *flag;
    cudaMalloc((void **)&flag, sizeof *flag);
    cudaMemset(flag, 0, sizeof *flag);
    kvg_emu_fail("launch", 1, 0);
    is_int(emu_t_config(g, g, 0, NULL, flag), cudaErrorLaunchOutOfResources,
           "an injected launch failure is the launch's error");
    int ran = 0;
    to_host(&ran, flag, sizeof ran);
    is_int(ran, 0, "and the kernel did not run");
    kvg_emu_fail("cublasLtMatmul", 1, 0);
    is_int(cublasLtMatmul(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                          NULL, NULL, 0, NULL), CUBLAS_STATUS_EXECUTION_FAILED,
           "an injected cublasLtMatmul failure");
    long before = kvg_emu_calls("launch");
    emu_t_config(g, g, 0, NULL, flag);
    is_int(kvg_emu_calls("launch"), before + 1, "launches are counted");

    setenv("KVG_EMU_FAIL", "cudaMalloc:1,cudaMemset:2:3", 1);
    kvg_emu_reset();
    is_int(cudaMalloc(&a, 16), cudaErrorMemoryAllocation, "KVG_EMU_FAIL: cudaMalloc:1");
    is_int(cudaMemset(flag, 0, 4), cudaSuccess, "cudaMemset:2 spares the first");
    is_int(cudaMemset(flag, 0, 4), cudaErrorInitializationError, "and fails the second with 3");
    unsetenv("KVG_EMU_FAIL");
    kvg_emu_fail("cudaFree", 1, 0);
    kvg_emu_reset();
    is_int(cudaFree(flag), cudaSuccess, "kvg_emu_reset forgets injected faults");
    cudaGetLastError();
}

/* ---- cuBLASLt ---- */

static float lowp_round(float x, cudaDataType t)
{
    /* the test's inputs are exact in every type: quarters in [-4, 4) */
    (void)t;
    return x;
}

static void store(void *base, cudaDataType t, size_t i, float x)
{
    if (t == CUDA_R_32F) {
        ((float *)base)[i] = x;
    } else if (t == CUDA_R_16BF) {
        ((unsigned short *)base)[i] = (unsigned short)(f_bits(x) >> 16);
    } else {
        ((unsigned short *)base)[i] = (unsigned short)f16_nearest(x);
    }
}

struct gemm_case {
    cublasOperation_t ta, tb;
    cudaDataType t;
    int m, n, k, bias, beta;
};

static cublasLtHandle_t lt;

/* Runs one GEMM through cuBLASLt and the naive loop; returns 1 if they agree. */
static int run_gemm(struct gemm_case g, cublasLtMatmulAlgo_t *algo_out)
{
    int m = g.m, n = g.n, k = g.k;
    int ar = g.ta == CUBLAS_OP_N ? m : k, ac = g.ta == CUBLAS_OP_N ? k : m;
    int br = g.tb == CUBLAS_OP_N ? k : n, bc = g.tb == CUBLAS_OP_N ? n : k;
    int lda = ar + 1, ldb = br + 2, ldc = m + 3, ldd = m;
    size_t es = g.t == CUDA_R_32F ? 4 : 2;
    float *af = calloc((size_t)lda * ac, sizeof *af), *bf = calloc((size_t)ldb * bc, sizeof *bf);
    float *cf = calloc((size_t)ldc * n, sizeof *cf), *bias = calloc((size_t)m, sizeof *bias);
    float *dref = calloc((size_t)ldd * n, sizeof *dref), *dgot = calloc((size_t)ldd * n, sizeof *dgot);
    void *ah = calloc((size_t)lda * ac, es), *bh = calloc((size_t)ldb * bc, es);
    for (int i = 0; i < lda * ac; i++) {
        af[i] = lowp_round((float)((int)(rnd() % 32) - 16) * 0.25f, g.t);
        store(ah, g.t, (size_t)i, af[i]);
    }
    for (int i = 0; i < ldb * bc; i++) {
        bf[i] = (float)((int)(rnd() % 32) - 16) * 0.25f;
        store(bh, g.t, (size_t)i, bf[i]);
    }
    for (int i = 0; i < ldc * n; i++)
        cf[i] = (float)((int)(rnd() % 16) - 8);
    for (int i = 0; i < m; i++)
        bias[i] = (float)i - 2.5f;
    float alpha = 1.5f, beta = g.beta ? 0.5f : 0.0f;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float acc = 0;
            for (int q = 0; q < k; q++) {
                float a = g.ta == CUBLAS_OP_N ? af[i + q * lda] : af[q + i * lda];
                float b = g.tb == CUBLAS_OP_N ? bf[q + j * ldb] : bf[j + q * ldb];
                acc += a * b;
            }
            float v = alpha * acc;
            if (g.beta)
                v += beta * cf[i + j * ldc];
            if (g.bias)
                v += bias[i];
            dref[i + j * ldd] = v;
        }
    void *dA = dev_from(ah, (size_t)lda * ac * es), *dB = dev_from(bh, (size_t)ldb * bc * es);
    float *dC = dev_from(cf, (size_t)ldc * n * sizeof *cf), *dD, *dbias = dev_from(bias, (size_t)m * 4);
    cudaMalloc((void **)&dD, (size_t)ldd * n * sizeof *dD);
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatmulPreference_t pref;
    int good = 1;
    good &= cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0;
    int32_t ta = g.ta, tb = g.tb;
    good &= cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == 0;
    good &= cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == 0;
    if (g.bias) {
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        int32_t bt = CUDA_R_32F;
        good &= cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                               sizeof epi) == 0;
        good &= cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias,
                                               sizeof dbias) == 0;
        good &= cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                               sizeof bt) == 0;
    }
    good &= cublasLtMatrixLayoutCreate(&la, g.t, (uint64_t)ar, (uint64_t)ac, lda) == 0;
    good &= cublasLtMatrixLayoutCreate(&lb, g.t, (uint64_t)br, (uint64_t)bc, ldb) == 0;
    good &= cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, (uint64_t)m, (uint64_t)n, ldc) == 0;
    good &= cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, (uint64_t)m, (uint64_t)n, ldd) == 0;
    good &= cublasLtMatmulPreferenceCreate(&pref) == 0;
    uint64_t ws = 0;
    good &= cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof ws) == 0;
    cublasLtMatmulHeuristicResult_t res;
    int count = 0;
    good &= cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 1, &res, &count) == 0;
    good &= count == 1 && res.state == CUBLAS_STATUS_SUCCESS && res.workspaceSize == 0;
    if (!good)
        diag("descriptor setup failed");
    cublasStatus_t st = cublasLtMatmul(lt, desc, &alpha, dA, la, dB, lb, &beta, dC, lc, dD, ld,
                                       &res.algo, NULL, 0, NULL);
    if (st != CUBLAS_STATUS_SUCCESS) {
        diag("cublasLtMatmul: %s", cublasLtGetStatusName(st));
        good = 0;
    }
    to_host(dgot, dD, (size_t)ldd * n * sizeof *dgot);
    for (int i = 0; i < ldd * n; i++)
        if (fabsf(dgot[i] - dref[i]) > 1e-5f * (1.0f + fabsf(dref[i]))) {
            if (good)
                diag("D[%d] = %g, expected %g", i, (double)dgot[i], (double)dref[i]);
            good = 0;
        }
    if (algo_out)
        *algo_out = res.algo;
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(dA); cudaFree(dB); cudaFree(dC); cudaFree(dD); cudaFree(dbias);
    free(af); free(bf); free(cf); free(bias); free(dref); free(dgot); free(ah); free(bh);
    return good;
}

static void test_cublaslt(void)
{
    size_t base = kvg_emu_bytes_in_use();
    is_int(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS, "cublasLtCreate");
    const cudaDataType types[3] = {CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF};
    const char *tn[3] = {"F32", "F16", "BF16"};
    long calls = kvg_emu_calls("cublasLtMatmul");
    for (int t = 0; t < 3; t++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                struct gemm_case g = {ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      types[t], 5, 3, 7, 0, (ta + tb) & 1};
                ok(run_gemm(g, NULL), "GEMM %s transa=%c transb=%c%s vs the naive loop", tn[t],
                   ta ? 'T' : 'N', tb ? 'T' : 'N', g.beta ? " with beta" : "");
            }
    is_int(kvg_emu_calls("cublasLtMatmul"), calls + 12, "the call counter saw 12 GEMMs");
    struct gemm_case biased = {CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF, 6, 4, 9, 1, 0};
    ok(run_gemm(biased, NULL), "GEMM with the BIAS epilogue (the engine's mapping)");
    struct gemm_case both = {CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_32F, 4, 4, 1, 1, 1};
    ok(run_gemm(both, NULL), "GEMM with bias and beta, k = 1");

    /* the algorithm's configuration */
    cublasLtMatmulAlgo_t algo;
    run_gemm(biased, &algo);
    int32_t id = -1, splitk = -1;
    uint32_t tile = 0;
    size_t written = 0;
    is_int(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id,
                                                &written), 0, "get CONFIG_ID");
    is_int(written, 4, "4 bytes written");
    is_int(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                                sizeof tile, NULL), 0, "get TILE_ID");
    is_int(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                sizeof splitk, NULL), 0, "get SPLITK_NUM");
    is_int(splitk, 1, "the heuristic's algorithm does not split k");
    splitk = 4;
    is_int(cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                sizeof splitk), 0, "set SPLITK_NUM 4");
    tile = 7;
    is_int(cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                                sizeof tile), 0, "set TILE_ID 7");
    splitk = 0;
    tile = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                         sizeof splitk, NULL);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile,
                                         NULL);
    ok(splitk == 4 && tile == 7, "and read them back");
    int32_t zero = 0;
    is_int(cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &zero,
                                                sizeof zero), CUBLAS_STATUS_INVALID_VALUE,
           "SPLITK_NUM 0 is invalid");
    is_int(cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &zero, 2),
           CUBLAS_STATUS_INVALID_VALUE, "a wrong attribute size is invalid");

    /* argument validation, on a small valid problem: D (4x3) = A^T (A 5x4) * B (5x3) */
    float *dA, *dB, *dD, host[64], one = 1.0f, zero_f = 0.0f;
    cudaMalloc((void **)&dA, 20 * 4);
    cudaMalloc((void **)&dB, 15 * 4);
    cudaMalloc((void **)&dD, 12 * 4);
    cudaMemset(dA, 0, 80);
    cudaMemset(dB, 0, 60);
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld, lbad_k, lbad_ld, lf16;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    int32_t T = CUBLAS_OP_T;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &T, sizeof T);
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 5, 4, 5);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 5, 3, 5);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 4, 3, 4);
    cublasLtMatrixLayoutCreate(&lbad_k, CUDA_R_32F, 6, 3, 6);
    cublasLtMatrixLayoutCreate(&lbad_ld, CUDA_R_32F, 5, 4, 4);
    cublasLtMatrixLayoutCreate(&lf16, CUDA_R_16F, 5, 3, 5);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t res;
    int cnt = 0;
    is_int(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &res, &cnt), 0,
           "heuristic for the valid problem");
    is_int(cnt, 1, "one algorithm");
    is_int(cublasLtMatmulAlgoCheck(lt, desc, la, lb, ld, ld, &res.algo, &res), 0,
           "cublasLtMatmulAlgoCheck");
#define MM(a_, la_, b_, lb_, d_, alpha_) \
    cublasLtMatmul(lt, desc, alpha_, a_, la_, b_, lb_, &zero_f, NULL, ld, d_, ld, &res.algo, NULL, 0, NULL)
    is_int(MM(dA, la, dB, lb, dD, &one), 0, "valid problem runs (C NULL with beta 0)");
    is_int(MM(dA, la, dB, lbad_k, dD, &one), CUBLAS_STATUS_INVALID_VALUE, "k mismatch");
    is_int(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lbad_k, ld, ld, pref, 1, &res, &cnt),
           CUBLAS_STATUS_INVALID_VALUE, "k mismatch in the heuristic");
    is_int(MM(dA, lbad_ld, dB, lb, dD, &one), CUBLAS_STATUS_INVALID_VALUE, "ld < rows");
    is_int(MM(NULL, la, dB, lb, dD, &one), CUBLAS_STATUS_INVALID_VALUE, "A NULL");
    is_int(MM(dA, la, dB, lb, NULL, &one), CUBLAS_STATUS_INVALID_VALUE, "D NULL");
    is_int(MM(dA, la, dB, lb, dD, NULL), CUBLAS_STATUS_INVALID_VALUE, "alpha NULL");
    is_int(MM(dA, la, dB, lf16, dD, &one), CUBLAS_STATUS_NOT_SUPPORTED, "mixed A/B types");
    fprintf(stderr, "# (the next line on stderr is expected)\n");
    is_int(MM(host, la, dB, lb, dD, &one), CUBLAS_STATUS_INVALID_VALUE, "A in host memory");
    is_int(MM(dA, la, dB, lb, dD, &one), 0, "still fine afterwards");
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    is_int(MM(dA, la, dB, lb, dD, &one), CUBLAS_STATUS_INVALID_VALUE, "BIAS without a pointer");
    int32_t bad_op = 9;
    is_int(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &bad_op, sizeof bad_op),
           CUBLAS_STATUS_INVALID_VALUE, "an unknown operation");
    is_int(cublasLtMatmul(NULL, desc, &one, dA, la, dB, lb, &zero_f, NULL, ld, dD, ld, NULL, NULL,
                          0, NULL), CUBLAS_STATUS_NOT_INITIALIZED, "no handle");
    int32_t got_t = -1;
    size_t wr = 0;
    cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &got_t, sizeof got_t, &wr);
    ok(got_t == CUBLAS_OP_T && wr == 4, "cublasLtMatmulDescGetAttribute reads TRANSA back");
    is_str(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE",
           "cublasLtGetStatusName");
#undef MM
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatrixLayoutDestroy(lbad_k);
    cublasLtMatrixLayoutDestroy(lbad_ld);
    cublasLtMatrixLayoutDestroy(lf16);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dD);
    is_int(cublasLtDestroy(lt), CUBLAS_STATUS_SUCCESS, "cublasLtDestroy");
    is_int(kvg_emu_bytes_in_use(), base, "the GEMM tests freed everything");
}

/* The fiber switch rate: a figure for the report, never an assertion. */
static void measure_switches(void)
{
    enum { B = 4, T = 256, IT = 200 };
    int *dout;
    cudaMalloc((void **)&dout, B * T * sizeof(int));
    long s0 = kvg_emu_switches();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    is_int(emu_t_sync_loop(B, T, IT, dout), cudaSuccess, "barrier loop");
    cudaDeviceSynchronize();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long sw = kvg_emu_switches() - s0;
    double sec = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    int out[B * T];
    to_host(out, dout, sizeof out);
    int good = 1;
    for (int i = 0; i < B * T; i++)
        good &= out[i] == (i % T) * IT;
    ok(good, "%d __syncthreads per thread computed right", IT);
    diag("fiber switches: %ld in %.3f s = %.1f M/s", sw, sec, (double)sw / sec / 1e6);
    cudaFree(dout);
}

int main(void)
{
    test_environment();
    test_block_sum();
    test_dyn_smem();
    test_warps();
    test_atomics();
    test_indices();
    test_config();
    test_partial_exit();
    test_conversions();
    test_memory();
    test_streams_events();
    test_faults();
    test_cublaslt();
    measure_switches();
    return done_testing();
}
