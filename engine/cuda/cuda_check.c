/* Errors of the CUDA backend: the first failure of a step is recorded with the call, the
 * operation (layer, shape) and the step number; the step's later operations are skipped
 * and end_step reports it (backend.h). */
#include "cuda_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void kvg_cu_err_text(cudaError_t e, char *buf, size_t len)
{
    const char *name = cudaGetErrorName(e), *what = cudaGetErrorString(e);
    snprintf(buf, len, "%s (%s)", name ? name : "cudaError?", what ? what : "unknown error");
}

static int record(kvg_cuda *c, const char *call, const char *what, const char *fmt, va_list ap)
{
    char detail[256] = "";
    if (c->failed)
        return -1;
    if (fmt && *fmt)
        vsnprintf(detail, sizeof detail, fmt, ap);
    c->failed = 1;
    if (c->op) {
        char where[64] = "";
        if (c->layer >= 0)
            snprintf(where, sizeof where, "layer %d ", c->layer);
        snprintf(c->err, sizeof c->err, "cuda: %s (%s%s%s%s) failed: %s in step %lld", call, where,
                 c->op, *detail ? ", " : "", detail, what, (long long)c->step);
    } else {
        snprintf(c->err, sizeof c->err, "cuda: %s%s%s%s failed: %s", call, *detail ? " (" : "",
                 detail, *detail ? ")" : "", what);
    }
    return -1;
}

int kvg_cu_fail(kvg_cuda *c, const char *call, cudaError_t e, const char *detail_fmt, ...)
{
    char what[200];
    va_list ap;
    int rc;
    kvg_cu_err_text(e, what, sizeof what);
    va_start(ap, detail_fmt);
    rc = record(c, call, what, detail_fmt, ap);
    va_end(ap);
    if (kvg_cu_sticky(e))
        kvg_cu_mark_dead(c, c->err);
    /* Any failed runtime call is also the thread's "last error", which the next kernel
     * launch reads back (cudaGetLastError) as its own: clear it here, once reported. */
    (void)cudaGetLastError();
    return rc;
}

int kvg_cu_fail_blas(kvg_cuda *c, const char *call, int status, const char *detail_fmt, ...)
{
    char what[200];
    const char *name = cublasLtGetStatusName((cublasStatus_t)status);
    const char *str = cublasLtGetStatusString((cublasStatus_t)status);
    va_list ap;
    int rc;
    snprintf(what, sizeof what, "%s (%s)", name ? name : "CUBLAS_STATUS_?", str ? str : "?");
    va_start(ap, detail_fmt);
    rc = record(c, call, what, detail_fmt, ap);
    va_end(ap);
    return rc;
}

int kvg_cu_fail_dnn(kvg_cuda *c, const char *call, int status, const char *detail_fmt, ...)
{
    char what[200];
    const char *name = cudnnGetErrorString((cudnnStatus_t)status);
    va_list ap;
    int rc;
    snprintf(what, sizeof what, "%s (%d)", name ? name : "CUDNN_STATUS_?", status);
    va_start(ap, detail_fmt);
    rc = record(c, call, what, detail_fmt, ap);
    va_end(ap);
    return rc;
}

/* The errors after which the CUDA context cannot run anything any more (the runtime's
 * documentation of each: "the process must be terminated and relaunched"): a kernel's
 * illegal or misaligned address, illegal instruction, invalid PC or address space,
 * stack overflow, device-side assert, timeout or other launch failure, and an
 * uncorrectable ECC error. Every later call returns the same error. */
int kvg_cu_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorECCUncorrectable:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
        return 1;
    default:
        return 0;
    }
}

void kvg_cu_mark_dead(kvg_cuda *c, const char *why)
{
    if (c->dead)
        return;
    c->dead = 1;
    snprintf(c->dead_err, sizeof c->dead_err, "%s", why);
}

/* Every device allocation (cuda_internal.h): refused while a step is captured into a
 * CUDA graph (cuda_graph.c). */
int kvg_cu_alloc_ok(kvg_cuda *c, const char *what)
{
    if (c->step_mode == KVG_CU_CAPTURE) {
        /* cudaMalloc/cudaFree in a capture: refused (and it would leave the graph with the
         * old address). The capture is given up; the step runs again eagerly and grows the
         * buffer then. */
        c->graph_grow = 1;
        if (!c->failed) {
            c->failed = 1;
            snprintf(c->err, sizeof c->err, "cuda: %s must grow during a graph capture", what);
        }
        return 0;
    }
    c->alloc_gen++;
    return 1;
}

/* Buffers that grow with the step (cuda_internal.h). */
int kvg_cu_grow_dev(kvg_cuda *c, void **p, size_t *cap, size_t need, const char *what)
{
    cudaError_t e;
    if (need <= *cap)
        return 0;
    if (!kvg_cu_alloc_ok(c, what))
        return -1;
    need = need < 4096 ? 4096 : need + need / 2;
    if (*p)
        cudaFree(*p);
    *p = NULL;
    *cap = 0;
    e = cudaMalloc(p, need);
    if (e != cudaSuccess) {
        *p = NULL;
        return kvg_cu_fail(c, "cudaMalloc", e, "%s, %zu bytes", what, need);
    }
    *cap = need;
    return 0;
}
