/* The strict emulator (kernels/emu/): each of its detectors fires on a planted bug, and
 * stays quiet on the correct twin.
 *   - randomized orders: a missing __syncthreads gives wrong results under some seeds,
 *     none under index order (the old emulator's);
 *   - the race detector: the missing barrier, a cross-block read, shared memory read before
 *     any thread wrote it; lanes ordered by __syncwarp are not a race;
 *   - pointer provenance: a host pointer, pinned host memory;
 *   - the stream model: a memset on the legacy stream that a non-blocking stream's kernel
 *     was meant to follow lands after it; a host read without synchronizing sees old
 *     bytes; blocking streams, events and cross-stream waits order work as on a GPU;
 *   - stream capture: work recorded, not run; each graph launch replays it; what CUDA
 *     refuses during a capture is refused and spoils the capture.
 * A bug that aborts runs in a child; the message must name the kernel and the bug. The
 * kernels are in t/unit/cuda_emu_strict_kernels.cu. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvg_cuda_api.h"
#include "tap.h"

cudaError_t strict_t_neighbour_sum(const float *x, float *out, int n, int with_barrier);
cudaError_t strict_t_warp_exchange(const float *x, float *out);
cudaError_t strict_t_chain_blocks(float *out, int blocks);
cudaError_t strict_t_read_pointer(const float *p, float *out);
cudaError_t strict_t_read_unwritten_shared(float *out);
cudaError_t strict_t_fill(float *out, int n, float v, cudaStream_t s);

/* The ASan build's kernels carry ASan's instrumentation, which takes the compiler hooks
 * the race detector and provenance checks use: those two run in the plain build. */
#if defined(__SANITIZE_ADDRESS__)
#define HOOKS 0
#else
#define HOOKS 1
#endif

enum { N = 64 };

static float *dev_alloc(size_t n)
{
    float *d = NULL;
    if (cudaMalloc((void **)&d, n * sizeof *d) != cudaSuccess) {
        printf("Bail out! cudaMalloc\n");
        exit(1);
    }
    return d;
}

static void skip(int n, const char *why)
{
    for (int i = 0; i < n; i++) {
        tap_count++;
        printf("ok %d # skip %s\n", tap_count, why);
    }
}

/* Runs `bug` in a child with stderr captured; the child must abort. */
struct outcome {
    int aborted;
    char msg[2048];
};

static struct outcome in_child(void (*bug)(void *), void *arg)
{
    struct outcome o = {0, ""};
    int fds[2];
    if (pipe(fds)) {
        printf("Bail out! pipe\n");
        exit(1);
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        bug(arg);
        cudaDeviceSynchronize();      /* queued work runs when the host waits for it */
        _exit(0);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t r;
    while ((r = read(fds[0], o.msg + len, sizeof o.msg - 1 - len)) > 0)
        len += (size_t)r;
    o.msg[len] = 0;
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    o.aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
    return o;
}

static void expect_abort(void (*bug)(void *), void *arg, const char *kernel, const char *says,
                         const char *what)
{
    struct outcome o = in_child(bug, arg);
    ok(o.aborted, "%s: aborts", what);
    ok(strstr(o.msg, kernel) && strstr(o.msg, says), "%s: the message names the kernel and the bug", what);
    if (!strstr(o.msg, kernel) || !strstr(o.msg, says))
        diag("child said: %s", o.msg);
}

/* ---- randomized orders ------------------------------------------------------------ */

/* Runs neighbour_sum without its barrier under KVG_EMU_SEED=seed with the detectors off;
 * returns how many outputs are wrong. x differs per call, so what an earlier launch left
 * in the static shared array is never the right value. */
static int wrong_outputs(const char *seed, int call)
{
    setenv("KVG_EMU_SEED", seed, 1);
    setenv("KVG_EMU_STRICT", "0", 1);
    kvg_emu_reset();
    float x[N], out[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)(call * 1000 + i + 1);
    float *dx = dev_alloc(N), *dout = dev_alloc(N);
    cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice);
    strict_t_neighbour_sum(dx, dout, N, 0);
    cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost);
    int wrong = 0;
    for (int i = 0; i < N; i++)
        wrong += out[i] != x[i] + (i ? x[i - 1] : 0.0f);
    cudaFree(dx);
    cudaFree(dout);
    unsetenv("KVG_EMU_SEED");
    unsetenv("KVG_EMU_STRICT");
    kvg_emu_reset();
    return wrong;
}

static void test_orders(void)
{
    int call = 0;
    is_int(wrong_outputs("0", ++call), 0,
           "a missing __syncthreads is invisible with threads in index order (the old emulator)");
    int seeds_wrong = 0, total = 0;
    char seed[16];
    for (int s = 1; s <= 4; s++) {
        snprintf(seed, sizeof seed, "%d", s);
        int w = wrong_outputs(seed, ++call);
        seeds_wrong += w > 0;
        total += w;
    }
    ok(seeds_wrong == 4, "under seeds 1-4 it gives wrong results every time (%d seeds, %d of %d "
       "outputs wrong in all)", seeds_wrong, total, 4 * N);
}

/* ---- the race detector and provenance ---------------------------------------------- */

static void bug_missing_barrier(void *arg)
{
    (void)arg;
    float *dx = dev_alloc(N), *dout = dev_alloc(N);
    cudaMemset(dx, 0, N * sizeof(float));
    strict_t_neighbour_sum(dx, dout, N, 0);
}

static void bug_cross_block(void *arg)
{
    (void)arg;
    float *dout = dev_alloc(8);
    strict_t_chain_blocks(dout, 8);
}

/* Host memory from malloc. (The program's own static data cannot be told from static
 * __shared__ arrays, which live there in the emulation: kernels/emu/cuda_emu_strict.cc.) */
static void bug_host_pointer(void *arg)
{
    float *host = calloc(32, sizeof *host);
    (void)arg;
    float *dout = dev_alloc(32);
    strict_t_read_pointer(host, dout);
}

static void bug_pinned_pointer(void *arg)
{
    float *pinned = NULL, *dout = dev_alloc(32);
    (void)arg;
    cudaMallocHost((void **)&pinned, 32 * sizeof *pinned);
    strict_t_read_pointer(pinned, dout);
}

static void bug_unwritten_shared(void *arg)
{
    (void)arg;
    float *dout = dev_alloc(32);
    strict_t_read_unwritten_shared(dout);
}

static void planted_bugs(void)
{
    expect_abort(bug_missing_barrier, NULL, "neighbour_sum", "no thread of this block has written",
                 "a missing __syncthreads (thread t reads s[t-1])");
    /* the same bug when t-1 ran first is a read of what another thread wrote in the
     * interval: another seed orders them so (both are the same missing barrier) */
    setenv("KVG_EMU_SEED", "3", 1);
    kvg_emu_reset();
    struct outcome o = in_child(bug_missing_barrier, NULL);
    ok(o.aborted && strstr(o.msg, "neighbour_sum") &&
       (strstr(o.msg, "a __syncthreads is missing") || strstr(o.msg, "no thread of this block")),
       "the missing barrier is reported under another seed too");
    unsetenv("KVG_EMU_SEED");
    kvg_emu_reset();
    expect_abort(bug_cross_block, NULL, "chain_blocks", "another block",
                 "a block reading another block's output in one launch");
    expect_abort(bug_host_pointer, NULL, "read_pointer", "a host pointer in a kernel",
                 "a kernel dereferencing a host pointer");
    expect_abort(bug_pinned_pointer, NULL, "read_pointer", "pinned host memory",
                 "a kernel dereferencing pinned host memory");
    expect_abort(bug_unwritten_shared, NULL, "read_unwritten_shared", "no thread of this block has written",
                 "a read of shared memory nobody wrote");
}

static void test_detectors(void)
{
    if (!HOOKS)
        skip(11, "the ASan build: its kernels carry ASan's instrumentation, not the strict checks' hooks");
    else
        planted_bugs();

    /* the correct twins run clean */
    float x[N], out[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)(i + 1);
    float *dx = dev_alloc(N), *dout = dev_alloc(N);
    cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice);
    is_int(strict_t_neighbour_sum(dx, dout, N, 1), cudaSuccess, "with its barrier");
    cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost);
    int good = 1;
    for (int i = 0; i < N; i++)
        good &= out[i] == x[i] + (i ? x[i - 1] : 0.0f);
    ok(good, "with its barrier: right, and no race reported");
    is_int(strict_t_warp_exchange(dx, dout), cudaSuccess, "lanes exchanging through shared memory");
    cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost);
    good = 1;
    for (int i = 0; i < N; i++)
        good &= out[i] == x[i - i % 32 + (i % 32 + 1) % 32];
    ok(good, "ordered by __syncwarp: right, and not reported as a race");
    cudaFree(dx);
    cudaFree(dout);
}

/* ---- the stream model ----------------------------------------------------------- */

static int all_equal(const float *d, int n, float v)
{
    float h[N];
    cudaMemcpy(h, d, (size_t)n * sizeof *h, cudaMemcpyDeviceToHost);
    for (int i = 0; i < n; i++)
        if (h[i] != v)
            return 0;
    return 1;
}

static void test_streams(void)
{
    cudaStream_t nb, nb2, blk;
    cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&nb2, cudaStreamNonBlocking);
    cudaStreamCreate(&blk);
    float *d = dev_alloc(N);

    /* The planted bug of issue 30 (the KV pool's zeroing): cudaMemset on the legacy stream,
     * then a kernel on a non-blocking stream. Nothing orders them. */
    cudaMemset(d, 0, N * sizeof(float));
    strict_t_fill(d, N, 7.0f, nb);
    cudaStreamSynchronize(nb);
    cudaDeviceSynchronize();
    ok(all_equal(d, N, 0.0f), "planted: a legacy-stream memset unordered against a non-blocking "
       "stream's kernel lands after it (the kernel's writes are lost)");
    cudaMemsetAsync(d, 0, N * sizeof(float), nb);
    strict_t_fill(d, N, 7.0f, nb);
    cudaStreamSynchronize(nb);
    cudaDeviceSynchronize();
    ok(all_equal(d, N, 7.0f), "the fix: the memset on the kernel's stream");
    cudaMemset(d, 0, N * sizeof(float));
    strict_t_fill(d, N, 5.0f, blk);
    cudaDeviceSynchronize();
    ok(all_equal(d, N, 5.0f), "a blocking stream's kernel waits for the legacy stream's memset");

    /* The host sees a stream's work only once it synchronized. */
    strict_t_fill(d, N, 9.0f, nb);
    ok(kvg_emu_pending() > 0, "a launch is queued, not run, at the call");
    ok(all_equal(d, N, 5.0f), "planted: cudaMemcpy (the legacy stream) does not wait for a "
       "non-blocking stream: the host reads the old values");
    float *pinned = NULL;
    cudaMallocHost((void **)&pinned, N * sizeof *pinned);
    pinned[0] = -1.0f;
    cudaMemcpyAsync(pinned, d, N * sizeof(float), cudaMemcpyDeviceToHost, nb);
    ok(pinned[0] == -1.0f, "a copy into pinned memory has not landed before the stream is synchronized");
    cudaStreamSynchronize(nb);
    ok(pinned[0] == 9.0f && kvg_emu_pending() == 0, "it has after cudaStreamSynchronize");
    float host[N];
    host[0] = -1.0f;
    strict_t_fill(d, N, 4.0f, nb);
    cudaMemcpyAsync(host, d, N * sizeof(float), cudaMemcpyDeviceToHost, nb);
    ok(host[0] == 4.0f, "a copy into pageable memory returns once done (the stream ran up to it)");

    /* Events: a cross-stream wait orders nb2 after nb. */
    cudaEvent_t ev;
    cudaEventCreate(&ev);
    strict_t_fill(d, N, 1.0f, nb);
    cudaEventRecord(ev, nb);
    is_int(cudaEventQuery(ev), cudaErrorNotReady, "an event its stream has not reached is not ready");
    cudaStreamWaitEvent(nb2, ev, 0);
    strict_t_fill(d, N / 2, 2.0f, nb2);
    cudaStreamSynchronize(nb2);
    float h[N];
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    ok(h[0] == 2.0f && h[N - 1] == 1.0f, "cudaStreamWaitEvent: nb2's kernel ran after nb's");
    is_int(cudaEventQuery(ev), cudaSuccess, "and the event completed");
    cudaEventDestroy(ev);

    cudaFreeHost(pinned);
    cudaFree(d);
    cudaStreamDestroy(nb);
    cudaStreamDestroy(nb2);
    cudaStreamDestroy(blk);
}

/* ---- stream capture and graphs ------------------------------------------------------ */

static void test_graphs(void)
{
    cudaStream_t nb;
    cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking);
    float *d = dev_alloc(N), *e = dev_alloc(N), *src = NULL, *dst = NULL;
    cudaMallocHost((void **)&src, N * sizeof *src);
    cudaMallocHost((void **)&dst, N * sizeof *dst);
    cudaMemsetAsync(e, 0, N * sizeof(float), nb);
    cudaStreamSynchronize(nb);

    /* pinned src -> d -> pinned dst, then a kernel filling e, then e -> dst's tail */
    enum cudaStreamCaptureStatus st;
    is_int(cudaStreamBeginCapture(nb, cudaStreamCaptureModeGlobal), cudaSuccess, "cudaStreamBeginCapture");
    cudaStreamIsCapturing(nb, &st);
    is_int(st, cudaStreamCaptureStatusActive, "the stream captures");
    cudaMemcpyAsync(d, src, N * sizeof(float), cudaMemcpyHostToDevice, nb);
    cudaMemcpyAsync(dst, d, N / 2 * sizeof(float), cudaMemcpyDeviceToHost, nb);
    strict_t_fill(e, N, 5.0f, nb);
    cudaMemcpyAsync(dst + N / 2, e + N / 2, N / 2 * sizeof(float), cudaMemcpyDeviceToHost, nb);
    cudaGraph_t graph = NULL;
    is_int(cudaStreamEndCapture(nb, &graph), cudaSuccess, "cudaStreamEndCapture");
    ok(graph && kvg_emu_pending() == 0, "captured work is recorded, not queued");
    ok(all_equal(e, N, 0.0f), "nor run");
    cudaGraphExec_t exec = NULL;
    is_int(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess, "cudaGraphInstantiate");
    cudaGraphDestroy(graph);     /* the executable graph keeps its own copy */
    int good = 1;
    for (int replay = 1; replay <= 2; replay++) {
        for (int i = 0; i < N; i++) {
            src[i] = (float)(replay * 100 + i);
            dst[i] = -1.0f;
        }
        is_int(cudaGraphLaunch(exec, nb), cudaSuccess, "cudaGraphLaunch %d", replay);
        good &= dst[0] == -1.0f;             /* queued, not run, until the stream is synchronized */
        cudaStreamSynchronize(nb);
        for (int i = 0; i < N / 2; i++)
            good &= dst[i] == (float)(replay * 100 + i);
        for (int i = N / 2; i < N; i++)
            good &= dst[i] == 5.0f;
    }
    ok(good, "each replay reads the pinned source as it is then, and runs the recorded kernel again");
    cudaGraphExecDestroy(exec);

    /* what a capture refuses, and the capture it spoils */
    is_int(cudaStreamBeginCapture(NULL, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported,
           "the legacy stream cannot capture");
    cudaGetLastError();
    struct {
        const char *what;
        int which;
    } refused[] = {{"cudaStreamSynchronize of the capturing stream", 0}, {"cudaMalloc", 1},
                   {"cudaDeviceSynchronize", 2}, {"a copy from pageable memory", 3}};
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++) {
        float host[N] = {0};
        float *extra = NULL;
        cudaError_t r = cudaSuccess;
        cudaStreamBeginCapture(nb, cudaStreamCaptureModeGlobal);
        strict_t_fill(d, N, 1.0f, nb);
        switch (refused[k].which) {
        case 0: r = cudaStreamSynchronize(nb); break;
        case 1: r = cudaMalloc((void **)&extra, 64); break;
        case 2: r = cudaDeviceSynchronize(); break;
        case 3: r = cudaMemcpyAsync(d, host, sizeof host, cudaMemcpyHostToDevice, nb); break;
        }
        is_int(r, cudaErrorStreamCaptureUnsupported, "%s during a capture is refused", refused[k].what);
        cudaStreamIsCapturing(nb, &st);
        is_int(st, cudaStreamCaptureStatusInvalidated, "and invalidates it");
        graph = (cudaGraph_t)1;
        is_int(cudaStreamEndCapture(nb, &graph), cudaErrorStreamCaptureInvalidated,
               "cudaStreamEndCapture then fails");
        ok(graph == NULL && kvg_emu_pending() == 0, "with no graph, and nothing of it queued");
        cudaGetLastError();
    }

    cudaFreeHost(src);
    cudaFreeHost(dst);
    cudaFree(d);
    cudaFree(e);
    cudaStreamDestroy(nb);
}

int main(void)
{
    test_orders();
    test_detectors();
    test_streams();
    test_graphs();
    return done_testing();
}
