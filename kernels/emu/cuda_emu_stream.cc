/* Streams and events: the order in which asynchronous work runs.
 *
 * Every asynchronous operation (a kernel, cudaMemcpyAsync, cudaMemsetAsync, cudaMemset,
 * cublasLtMatmul, a cuDNN execution, an event record) is checked at the call and then
 * QUEUED on its stream (on_stream). Queued work runs only when the host needs it: at the
 * synchronization points below, in stream order. So, as on a GPU:
 *   - two streams are not ordered unless the program orders them: work on the legacy
 *     default stream (NULL) waits for the earlier work of every blocking stream and the
 *     blocking streams' later work waits for it; a cudaStreamNonBlocking stream is ordered
 *     against nothing but its own work and the events it waits for;
 *   - the host sees a result only after synchronizing with it.
 * Deferring every operation to the last moment the program allows is the adversarial
 * schedule: a memset on the legacy stream that a non-blocking stream's kernels were meant
 * to follow runs AFTER them (at the next device-wide synchronization), and a host read of a
 * buffer a stream has not been synchronized with sees the old bytes.
 *
 * Synchronization points (each runs the queued work it waits for, and only the one late
 * run below besides):
 *   cudaStreamSynchronize(s)               s's queue; then, for a non-blocking s, the
 *                                          legacy stream's work queued before the last of
 *                                          s's (unordered: it may as well finish after)
 *   cudaEventSynchronize(e)                e's stream up to the record
 *   cudaStreamWaitEvent(s, e)              (queued on s) e's stream up to the record
 *   cudaMemcpy, cudaMemcpyAsync to pageable host memory      the copy's stream up to it
 *   cudaDeviceSynchronize, cudaFree, cudaFreeHost, cudaStreamDestroy, kvg_emu_reset
 *                                          every stream: non-blocking ones first, then the
 *                                          blocking ones, the legacy stream last
 *
 * An operation that runs increments its stream's `done`; a dependency is (stream, count):
 * "run that stream until `done` reaches count". Dependencies only point at work enqueued
 * earlier, so draining never waits on itself. */
#include <stdio.h>
#include <time.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "cuda_emu_internal.h"

namespace kvg_emu {
struct EventState;
}

struct CUstream_st {
    explicit CUstream_st(unsigned int f) : flags(f) {}
    unsigned int flags;
    std::deque<std::pair<uint64_t, std::function<void()>>> queue;   /* (global number, op) */
    uint64_t enqueued = 0;       /* operations ever queued */
    uint64_t done = 0;           /* operations taken off the queue (run or running) */
    uint64_t order = 0;          /* creation order, for the device-wide drain */
    CUgraph_st *capture = nullptr;   /* recording instead of queueing */
    int capture_mode = 0;
    std::thread::id capture_thread;  /* who began it (thread-local mode refuses only it) */
    bool capture_invalid = false;
};

struct CUgraph_st {
    std::vector<std::function<void()>> ops;   /* in capture order */
};

struct CUgraphExec_st {
    std::vector<std::function<void()>> ops;
};

struct CUevent_st {
    unsigned int flags;
    std::shared_ptr<kvg_emu::EventState> state;
};

namespace kvg_emu {

struct EventState {
    unsigned generation = 0;     /* bumped by each record: a stale marker does nothing */
    bool recorded = false;
    bool complete = true;        /* a never-recorded event counts as complete */
    CUstream_st *stream = nullptr;
    uint64_t target = 0;         /* stream->done once its marker ran */
    double ms = 0.0;
};

namespace {

struct Streams {
    CUstream_st legacy{(unsigned)cudaStreamDefault};
    std::set<CUstream_st *> live;   /* created, not destroyed (the legacy one not in it) */
    std::set<CUevent_st *> events;
    uint64_t next_order = 1;
    uint64_t next_op = 1;        /* every operation's number, across streams: enqueue order */
    long ops_run = 0;
};

Streams &ss()
{
    static Streams s;
    return s;
}

CUstream_st *resolve(cudaStream_t s)
{
    return s ? s : &ss().legacy;
}

double now_ms()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

bool blocking(const CUstream_st *s)
{
    return s != &ss().legacy && !(s->flags & cudaStreamNonBlocking);
}

void push(CUstream_st *s, std::function<void()> op)
{
    s->queue.emplace_back(ss().next_op++, std::move(op));
    s->enqueued++;
}

}  // namespace

/* Runs s's work until `upto` of its operations have run; returns the highest global
 * number among those it ran (0: none). */
uint64_t drain(CUstream_st *s, uint64_t upto)
{
    uint64_t last = 0;
    while (s->done < upto && !s->queue.empty()) {
        last = s->queue.front().first;
        std::function<void()> op = std::move(s->queue.front().second);
        s->queue.pop_front();
        s->done++;
        ss().ops_run++;
        op();
    }
    return last;
}

/* A host synchronization with s. For a non-blocking s, the legacy stream's work queued
 * BEFORE the last of s's work that just ran is run now, AFTER it: nothing ordered the two,
 * so that is a schedule a GPU may take, and it is the one that shows a default-stream
 * call (cudaMemset, cudaMemcpy without a stream) the program meant to come first. */
void drain_stream(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    CUstream_st *st = resolve(s);
    uint64_t last = drain(st, st->enqueued);
    if (st->flags & cudaStreamNonBlocking) {
        CUstream_st *l = &ss().legacy;
        while (!l->queue.empty() && l->queue.front().first < last)
            drain(l, l->done + 1);
    }
}

void drain_all()
{
    std::lock_guard<std::recursive_mutex> g(lock());
    Streams &S = ss();
    /* Until nothing is left: a blocking stream's work may wait for the legacy stream. */
    for (;;) {
        std::vector<CUstream_st *> order(S.live.begin(), S.live.end());
        std::stable_sort(order.begin(), order.end(), [](const CUstream_st *a, const CUstream_st *b) {
            bool nba = a->flags & cudaStreamNonBlocking, nbb = b->flags & cudaStreamNonBlocking;
            return nba != nbb ? nba : a->order < b->order;
        });
        order.push_back(&S.legacy);
        bool any = false;
        for (CUstream_st *s : order)
            if (!s->queue.empty()) {
                any = true;
                drain(s, s->enqueued);
            }
        if (!any)
            return;
    }
}

bool capturing(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    return resolve(s)->capture != nullptr;
}

void invalidate_capture(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    CUstream_st *st = resolve(s);
    if (st->capture)
        st->capture_invalid = true;
}

bool capture_refuses()
{
    std::lock_guard<std::recursive_mutex> g(lock());
    bool refused = false;
    for (CUstream_st *s : ss().live)
        if (s->capture && (s->capture_mode == cudaStreamCaptureModeGlobal ||
                           (s->capture_mode == cudaStreamCaptureModeThreadLocal &&
                            s->capture_thread == std::this_thread::get_id()))) {
            s->capture_invalid = true;
            refused = true;
        }
    return refused;
}

void on_stream(cudaStream_t stream, std::function<void()> op)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    Streams &S = ss();
    CUstream_st *s = resolve(stream);
    if (s->capture) {
        s->capture->ops.push_back(std::move(op));   /* recorded, run by graph launches */
        return;
    }
    if (s == &S.legacy && capture_refuses())
        return;                  /* the legacy stream would depend on a capture: dropped */
    /* The legacy stream's implicit ordering, as dependencies taken now. */
    if (s == &S.legacy) {
        for (CUstream_st *b : S.live)
            if (blocking(b) && b->done < b->enqueued) {
                uint64_t upto = b->enqueued;
                push(s, [b, upto]() { drain(b, upto); });
            }
    } else if (blocking(s) && S.legacy.done < S.legacy.enqueued) {
        uint64_t upto = S.legacy.enqueued;
        CUstream_st *l = &S.legacy;
        push(s, [l, upto]() { drain(l, upto); });
    }
    push(s, std::move(op));
}

uint64_t stream_enqueued(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    return resolve(s)->enqueued;
}

void drain_upto(cudaStream_t s, uint64_t upto)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    drain(resolve(s), upto);
}

bool valid_stream(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    return !s || ss().live.count(s) != 0;
}

}  // namespace kvg_emu

using namespace kvg_emu;

extern "C" {

cudaError_t cudaDeviceSynchronize(void)
{
    EMU_CALL("cudaDeviceSynchronize", cudaErrorLaunchFailure);
    if (capture_refuses())
        return record(cudaErrorStreamCaptureUnsupported);
    drain_all();
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    EMU_CALL("cudaStreamCreateWithFlags", cudaErrorMemoryAllocation);
    if (!pStream || (flags & ~(unsigned)cudaStreamNonBlocking))
        return record(cudaErrorInvalidValue);
    cudaStream_t s = new CUstream_st(flags);
    s->order = ss().next_order++;
    ss().live.insert(s);
    *pStream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    {
        EMU_CALL("cudaStreamCreate", cudaErrorMemoryAllocation);
    }
    return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

/* The stream's work still runs (as the real call lets it finish), then it is gone. */
cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    EMU_CALL("cudaStreamDestroy", cudaErrorInvalidResourceHandle);
    if (!stream || !ss().live.count(stream))
        return record(cudaErrorInvalidResourceHandle);
    drain_all();
    ss().live.erase(stream);
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    EMU_CALL("cudaStreamSynchronize", cudaErrorLaunchFailure);
    if (!valid_stream(stream))
        return record(cudaErrorInvalidResourceHandle);
    if (resolve(stream)->capture) {
        resolve(stream)->capture_invalid = true;
        return record(cudaErrorStreamCaptureUnsupported);
    }
    drain_stream(stream);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    EMU_CALL("cudaStreamQuery", cudaErrorLaunchFailure);
    if (!valid_stream(stream))
        return record(cudaErrorInvalidResourceHandle);
    if (resolve(stream)->capture) {
        resolve(stream)->capture_invalid = true;
        return record(cudaErrorStreamCaptureUnsupported);
    }
    return resolve(stream)->queue.empty() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    EMU_CALL("cudaStreamWaitEvent", cudaErrorInvalidResourceHandle);
    if (!valid_stream(stream) || !event || !ss().events.count(event))
        return record(cudaErrorInvalidResourceHandle);
    if (flags)
        return record(cudaErrorInvalidValue);
    std::shared_ptr<EventState> st = event->state;
    if (st->complete)
        return cudaSuccess;
    /* What the event marks now, not what a later record will: */
    CUstream_st *src = st->stream;
    uint64_t upto = st->target;
    unsigned gen = st->generation;
    on_stream(stream, [st, src, upto, gen]() {
        if (!st->complete || st->generation != gen)
            drain(src, upto);
    });
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    EMU_CALL("cudaEventCreateWithFlags", cudaErrorMemoryAllocation);
    if (!event || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming)))
        return record(cudaErrorInvalidValue);
    cudaEvent_t e = new CUevent_st{flags, std::make_shared<EventState>()};
    ss().events.insert(e);
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    {
        EMU_CALL("cudaEventCreate", cudaErrorMemoryAllocation);
    }
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    EMU_CALL("cudaEventRecord", cudaErrorInvalidResourceHandle);
    if (!event || !ss().events.count(event) || !valid_stream(stream))
        return record(cudaErrorInvalidResourceHandle);
    std::shared_ptr<EventState> st = event->state;
    unsigned gen = ++st->generation;
    st->recorded = true;
    st->complete = false;
    st->stream = resolve(stream);
    on_stream(stream, [st, gen]() {
        if (st->generation != gen)
            return;
        st->complete = true;
        st->ms = now_ms();
    });
    st->target = st->stream->enqueued;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    EMU_CALL("cudaEventQuery", cudaErrorInvalidResourceHandle);
    if (!event || !ss().events.count(event))
        return record(cudaErrorInvalidResourceHandle);
    return event->state->complete ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    EMU_CALL("cudaEventSynchronize", cudaErrorLaunchFailure);
    if (!event || !ss().events.count(event))
        return record(cudaErrorInvalidResourceHandle);
    std::shared_ptr<EventState> st = event->state;
    if (!st->complete)
        drain(st->stream, st->target);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    EMU_CALL("cudaEventElapsedTime", cudaErrorInvalidResourceHandle);
    if (!ms)
        return record(cudaErrorInvalidValue);
    if (!start || !end || !ss().events.count(start) || !ss().events.count(end) ||
        (start->flags & cudaEventDisableTiming) || (end->flags & cudaEventDisableTiming))
        return record(cudaErrorInvalidResourceHandle);
    if (!start->state->recorded || !end->state->recorded)
        return record(cudaErrorInvalidResourceHandle);
    if (!start->state->complete || !end->state->complete)
        return record(cudaErrorNotReady);
    *ms = (float)(end->state->ms - start->state->ms);
    return cudaSuccess;
}

/* A pending record still completes (its marker holds the state), as the real event's
 * resources are freed once the device is done with it. */
cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    EMU_CALL("cudaEventDestroy", cudaErrorInvalidResourceHandle);
    if (!event || !ss().events.erase(event))
        return record(cudaErrorInvalidResourceHandle);
    delete event;
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    EMU_CALL("cudaStreamBeginCapture", cudaErrorStreamCaptureUnsupported);
    if (!stream)
        return record(cudaErrorStreamCaptureUnsupported);   /* not the legacy stream */
    if (!valid_stream(stream))
        return record(cudaErrorInvalidResourceHandle);
    if ((int)mode < cudaStreamCaptureModeGlobal || (int)mode > cudaStreamCaptureModeRelaxed ||
        stream->capture)
        return record(cudaErrorInvalidValue);
    stream->capture = new CUgraph_st;
    stream->capture_mode = (int)mode;
    stream->capture_thread = std::this_thread::get_id();
    stream->capture_invalid = false;
    return cudaSuccess;
}

/* A failure (an injected one too) ends the capture all the same, as CUDA's does: the
 * stream queues its work again. */
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    std::lock_guard<std::recursive_mutex> guard(lock());
    cudaError_t dev = device_state();
    int inj = injected("cudaStreamEndCapture", cudaErrorStreamCaptureInvalidated);
    if (!pGraph)
        return record(cudaErrorInvalidValue);
    *pGraph = nullptr;
    if (!stream || !valid_stream(stream))
        return record(cudaErrorInvalidResourceHandle);
    if (!stream->capture)
        return record(cudaErrorInvalidValue);
    CUgraph_st *graph = stream->capture;
    bool invalid = stream->capture_invalid;
    stream->capture = nullptr;
    stream->capture_invalid = false;
    if (dev || inj) {
        delete graph;
        return record(dev ? dev : (cudaError_t)inj);
    }
    if (invalid) {
        delete graph;
        return record(cudaErrorStreamCaptureInvalidated);
    }
    *pGraph = graph;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus)
{
    EMU_CALL("cudaStreamIsCapturing", cudaErrorInvalidValue);
    if (!pCaptureStatus)
        return record(cudaErrorInvalidValue);
    if (!valid_stream(stream))
        return record(cudaErrorInvalidResourceHandle);
    CUstream_st *s = resolve(stream);
    *pCaptureStatus = !s->capture ? cudaStreamCaptureStatusNone
                      : s->capture_invalid ? cudaStreamCaptureStatusInvalidated
                                           : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags)
{
    EMU_CALL("cudaGraphInstantiate", cudaErrorInvalidValue);
    if (!pGraphExec || !graph || flags)
        return record(cudaErrorInvalidValue);
    *pGraphExec = new CUgraphExec_st{graph->ops};
    return cudaSuccess;
}

/* Queues a copy of each recorded operation, in capture order, on the stream. */
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    EMU_CALL("cudaGraphLaunch", cudaErrorLaunchFailure);
    if (!graphExec)
        return record(cudaErrorInvalidValue);
    if (!valid_stream(stream))
        return record(cudaErrorInvalidResourceHandle);
    for (const std::function<void()> &op : graphExec->ops)
        on_stream(stream, op);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
    EMU_CALL("cudaGraphExecDestroy", cudaErrorInvalidValue);
    if (!graphExec)
        return record(cudaErrorInvalidValue);
    delete graphExec;            /* queued copies of its operations stay valid */
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    EMU_CALL("cudaGraphDestroy", cudaErrorInvalidValue);
    if (!graph)
        return record(cudaErrorInvalidValue);
    delete graph;
    return cudaSuccess;
}

long kvg_emu_pending(void)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    long n = (long)ss().legacy.queue.size();
    for (CUstream_st *s : ss().live)
        n += (long)s->queue.size();
    return n;
}

}  // extern "C"
