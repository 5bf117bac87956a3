/* Kernel launches: the blocks of a grid run one after another on the launching thread,
 * the threads of a block are fibers, and the barriers switch between them.
 *
 * Scheduling: the launching thread's stack is the scheduler. It resumes every runnable
 * fiber of the block in thread order; a fiber runs until it finishes or parks at a
 * barrier, then switches back. __syncthreads releases its waiters when every live (not
 * exited) thread of the block waits; a warp operation (__syncwarp, shuffle, vote)
 * completes when every live lane of its mask has arrived with the same mask, and the last
 * lane to arrive computes every lane's result at once, so the exchange slot is never
 * reused while a lane still needs it. When no fiber can run and no barrier can be
 * released the kernel is deadlocked on a GPU too: the emulator aborts and says where
 * each thread waits.
 *
 * Switching: on x86-64 a hand-written switch saves the callee-saved registers, MXCSR and
 * the x87 control word and swaps stack pointers (no syscall; glibc's swapcontext makes a
 * sigprocmask syscall per switch). Elsewhere, or with -DKVG_EMU_UCONTEXT, ucontext.
 * Measured by t/unit/cuda_emu (a __syncthreads loop, scheduler included): about 55 M
 * switches/s with the hand-written switch, 4 M/s with swapcontext, 20 M/s under ASan. Each fiber has its own stack, mmap'd
 * once with a PROT_NONE guard page below it (an overflow faults instead of corrupting the
 * neighbour), kept and reused by later launches.
 *
 * ASan: every switch is announced with __sanitizer_start_switch_fiber /
 * __sanitizer_finish_switch_fiber so ASan knows which stack is live; without that it
 * reports false stack-buffer overflows. With the annotations, the ASan+UBSan build runs
 * kernels clean, and an out-of-bounds access to device memory (host memory here) is a
 * real ASan report. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cuda_emu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define KVG_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVG_EMU_ASAN 1
#endif
#endif

#ifdef KVG_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__) && !defined(KVG_EMU_UCONTEXT)
#define KVG_EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

/* The index variables of the running fiber (see cuda_emu.h). */
kvg_emu_index kvg_emu_idx;

#ifdef KVG_EMU_ASM_SWITCH
/* kvg_emu_ctx_switch(save, load): pushes the callee-saved registers and the FP control
 * state, stores rsp in *save, loads `load` as rsp, pops the same and returns on the new
 * stack. A new fiber's stack is prepared so that the first switch "returns" into
 * kvg_emu_ctx_entry with the entry function in r13 and its argument in r12. */
asm(R"(
    .pushsection .text
    .p2align 4
    .globl kvg_emu_ctx_switch
    .hidden kvg_emu_ctx_switch
    .type kvg_emu_ctx_switch, @function
kvg_emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kvg_emu_ctx_switch, .-kvg_emu_ctx_switch

    .p2align 4
    .globl kvg_emu_ctx_entry
    .hidden kvg_emu_ctx_entry
    .type kvg_emu_ctx_entry, @function
kvg_emu_ctx_entry:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size kvg_emu_ctx_entry, .-kvg_emu_ctx_entry
    .popsection
)");
extern "C" void kvg_emu_ctx_switch(void **save, void *load);
extern "C" void kvg_emu_ctx_entry(void);
#endif

namespace kvg_emu {
namespace {

enum FiberState { RUNNABLE, WAIT_BLOCK, WAIT_WARP, DONE };

#ifdef KVG_EMU_ASAN
constexpr size_t STACK_SIZE = 512 << 10;   /* ASan frames carry redzones */
#else
constexpr size_t STACK_SIZE = 128 << 10;
#endif

struct Fiber {
#ifdef KVG_EMU_ASM_SWITCH
    void *sp;
#else
    ucontext_t uc;
#endif
    char *stack;                 /* the usable stack, STACK_SIZE bytes above the guard */
    int state;
    uint3 tid;
    const char *bar_file;        /* where it waits in __syncthreads */
    int bar_line;
    int wkind;                   /* its pending warp operation */
    unsigned wmask;
    uint64_t wvalue, wresult;
    int warg, wwidth;
#ifdef KVG_EMU_ASAN
    void *fake_stack;
#endif
};

struct Launch {
    bool active = false;
    const char *name = nullptr;
    void (*fn)(void *) = nullptr;
    void *ctx = nullptr;
    unsigned n = 0;              /* threads per block */
    unsigned cur = 0;            /* the running fiber */
    unsigned done = 0;
    unsigned block_waiters = 0;
    char *smem = nullptr;
    size_t smem_size = 0;
    std::vector<Fiber> fibers;
#ifdef KVG_EMU_ASM_SWITCH
    void *sched_sp = nullptr;
#else
    ucontext_t sched_uc;
#endif
#ifdef KVG_EMU_ASAN
    const void *host_bottom = nullptr;
    size_t host_size = 0;
#endif
    long switches = 0;
    uint64_t rng = 0;            /* this launch's schedule (splitmix64 state) */
    bool shuffle = true;         /* KVG_EMU_SEED=0: thread and block order, as numbered */
    std::vector<unsigned> order; /* the fibers, in this round's order */
};

Launch L;
long launches = 0;

uint64_t next_random()
{
    uint64_t z = (L.rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A random permutation of v (Fisher-Yates), unless the order is fixed. */
void shuffle(std::vector<unsigned> &v)
{
    if (!L.shuffle)
        return;
    for (size_t i = v.size(); i > 1; i--) {
        size_t j = (size_t)(next_random() % i);
        unsigned t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}

/* "kvg_k_rmsnorm" out of "void kvg_emu_launch(...) [with F = kvg_k_rmsnorm(...)::<lambda()>]". */
std::string kernel_name()
{
    std::string s = L.name ? L.name : "?";
    size_t w = s.find("[with F = ");
    if (w == std::string::npos)
        return s;
    s = s.substr(w + 10);
    size_t e = s.find("::<lambda");
    if (e != std::string::npos)
        s = s.substr(0, e);
    size_t paren = s.find('(');
    if (paren != std::string::npos)
        s = s.substr(0, paren);
    return s;
}

[[noreturn]] void kernel_fatal(const char *what)
{
    fatal("kernel %s, block (%u,%u,%u): %s", kernel_name().c_str(), blockIdx.x, blockIdx.y,
          blockIdx.z, what);
}

std::vector<char *> &all_stacks()
{
    static std::vector<char *> stacks;
    return stacks;
}

void fiber_main(void *);
#ifndef KVG_EMU_ASM_SWITCH
void fiber_main_uc(int i) { fiber_main((void *)(uintptr_t)i); }
#endif

char *stack_for(unsigned i)
{
    std::vector<char *> &stacks = all_stacks();
    while (stacks.size() <= i) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        void *m = mmap(nullptr, STACK_SIZE + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            fatal("cannot map a %zu-byte fiber stack", STACK_SIZE);
        if (mprotect(m, page, PROT_NONE))   /* the guard page */
            fatal("cannot protect a fiber stack's guard page");
        stacks.push_back((char *)m + page);
    }
    return stacks[i];
}

/* A fresh context on fiber i's stack that starts in fiber_main. */
void prepare(unsigned i)
{
    Fiber &f = L.fibers[i];
#ifdef KVG_EMU_ASM_SWITCH
    uint64_t *top = (uint64_t *)(f.stack + STACK_SIZE);
    uint64_t *sp = top - 8;      /* 16-byte aligned: the entry's call sees an ABI stack */
    uint32_t fp_ctl[2] = {0x1f80, 0x037f};   /* default MXCSR, x87 control word */
    memcpy(&sp[0], fp_ctl, sizeof fp_ctl);
    sp[1] = 0;                                /* r15 */
    sp[2] = 0;                                /* r14 */
    sp[3] = (uint64_t)(uintptr_t)&fiber_main; /* r13: the function */
    sp[4] = (uint64_t)i;                      /* r12: its argument */
    sp[5] = 0;                                /* rbx */
    sp[6] = 0;                                /* rbp */
    sp[7] = (uint64_t)(uintptr_t)&kvg_emu_ctx_entry;
    f.sp = sp;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = STACK_SIZE;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, (void (*)())fiber_main_uc, 1, (int)i);
#endif
}

/* Scheduler -> fiber i, back when it parks or finishes. */
void resume(unsigned i)
{
    Fiber &f = L.fibers[i];
    L.cur = i;
    threadIdx = f.tid;
    L.switches += 2;
    strict::now.tid = i;
    strict::now.stack_lo = (uintptr_t)f.stack;
    strict::now.stack_size = STACK_SIZE;
    strict::now.in_kernel = true;
#ifdef KVG_EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f.stack, STACK_SIZE);
#endif
#ifdef KVG_EMU_ASM_SWITCH
    kvg_emu_ctx_switch(&L.sched_sp, f.sp);
#else
    swapcontext(&L.sched_uc, &f.uc);
#endif
#ifdef KVG_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    strict::now.in_kernel = false;
}

/* The running fiber -> the scheduler; returns when the scheduler resumes it. */
void park()
{
    Fiber &f = L.fibers[L.cur];
#ifdef KVG_EMU_ASAN
    __sanitizer_start_switch_fiber(f.state == DONE ? nullptr : &f.fake_stack, L.host_bottom,
                                   L.host_size);
#endif
#ifdef KVG_EMU_ASM_SWITCH
    kvg_emu_ctx_switch(&f.sp, L.sched_sp);
#else
    swapcontext(&f.uc, &L.sched_uc);
#endif
#ifdef KVG_EMU_ASAN
    __sanitizer_finish_switch_fiber(f.fake_stack, &L.host_bottom, &L.host_size);
#endif
}

void fiber_main(void *arg)
{
    unsigned i = (unsigned)(uintptr_t)arg;
#ifdef KVG_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &L.host_bottom, &L.host_size);
#endif
    L.fn(L.ctx);
    L.fibers[i].state = DONE;
    park();
    fatal("a finished fiber was resumed");
}

const char *warp_kind_name(int k)
{
    switch (k) {
    case KVG_EMU_WARP_SYNC: return "__syncwarp";
    case KVG_EMU_WARP_SHFL_IDX: return "__shfl_sync";
    case KVG_EMU_WARP_SHFL_XOR: return "__shfl_xor_sync";
    case KVG_EMU_WARP_SHFL_DOWN: return "__shfl_down_sync";
    case KVG_EMU_WARP_SHFL_UP: return "__shfl_up_sync";
    case KVG_EMU_WARP_BALLOT: return "a vote (__ballot/__any/__all_sync)";
    }
    return "?";
}

std::string where(unsigned i)
{
    const Fiber &f = L.fibers[i];
    char buf[200];
    int len = snprintf(buf, sizeof buf, "thread (%u,%u,%u) ", f.tid.x, f.tid.y, f.tid.z);
    switch (f.state) {
    case WAIT_BLOCK:
        snprintf(buf + len, sizeof buf - (size_t)len, "waits in __syncthreads at %s:%d",
                 f.bar_file, f.bar_line);
        break;
    case WAIT_WARP:
        snprintf(buf + len, sizeof buf - (size_t)len, "waits in %s (mask 0x%08x)",
                 warp_kind_name(f.wkind), f.wmask);
        break;
    case DONE:
        snprintf(buf + len, sizeof buf - (size_t)len, "has exited");
        break;
    default:
        snprintf(buf + len, sizeof buf - (size_t)len, "is runnable");
        break;
    }
    return buf;
}

/* All live threads wait in __syncthreads: check they wait at the same one, let them go. */
void release_block()
{
    const Fiber *first = nullptr;
    for (unsigned i = 0; i < L.n; i++) {
        Fiber &f = L.fibers[i];
        if (f.state != WAIT_BLOCK)
            continue;
        if (!first) {
            first = &f;
        } else if (f.bar_line != first->bar_line || strcmp(f.bar_file, first->bar_file)) {
            std::string msg = "threads wait at different __syncthreads: " +
                              where((unsigned)(first - L.fibers.data())) + "; " + where(i);
            kernel_fatal(msg.c_str());
        }
    }
    for (unsigned i = 0; i < L.n; i++)
        if (L.fibers[i].state == WAIT_BLOCK)
            L.fibers[i].state = RUNNABLE;
    L.block_waiters = 0;
    strict::barrier();
}

/* A lane of the warp starting at thread `base` that exists and has not exited. */
bool lane_live(unsigned base, unsigned l)
{
    return base + l < L.n && L.fibers[base + l].state != DONE;
}

/* Completes the warp operation of `mask` in the warp at `base` if every live lane of the
 * mask waits in it with that mask: computes each lane's result (the value of the lane it
 * reads, or the ballot) and lets them go. Exited lanes, and the absent lanes of a partial
 * warp, do not take part (as on a GPU); a lane reading one of them aborts, since it would
 * read an undefined value. */
bool try_complete(unsigned base, unsigned mask)
{
    const Fiber *first = nullptr;
    for (unsigned l = 0; l < 32; l++) {
        if (!(mask >> l & 1u) || !lane_live(base, l))
            continue;
        const Fiber &g = L.fibers[base + l];
        if (g.state != WAIT_WARP || g.wmask != mask)
            return false;
        if (!first) {
            first = &g;
        } else if (g.wkind != first->wkind) {
            std::string m = "lanes of one warp meet in different warp operations: " +
                            where((unsigned)(first - L.fibers.data())) + "; " + where(base + l);
            kernel_fatal(m.c_str());
        }
    }
    if (!first)
        return false;
    int kind = first->wkind;
    uint64_t ballot = 0;
    for (unsigned l = 0; l < 32; l++)
        if ((mask >> l & 1u) && lane_live(base, l) && L.fibers[base + l].wvalue)
            ballot |= 1ull << l;
    char msg[320];
    for (unsigned l = 0; l < 32; l++) {
        if (!(mask >> l & 1u) || !lane_live(base, l))
            continue;
        Fiber &g = L.fibers[base + l];
        unsigned w = (unsigned)g.wwidth, seg = l & ~(w - 1), pos = l - seg;
        unsigned src = l;
        switch (kind) {
        case KVG_EMU_WARP_SYNC: g.wresult = 0; continue;
        case KVG_EMU_WARP_BALLOT: g.wresult = ballot; continue;
        case KVG_EMU_WARP_SHFL_IDX: src = seg + ((unsigned)g.warg & (w - 1)); break;
        case KVG_EMU_WARP_SHFL_XOR: {
            unsigned x = l ^ ((unsigned)g.warg & 31u);
            src = x >= seg + w ? l : x;               /* a later group: own value */
            break;
        }
        case KVG_EMU_WARP_SHFL_DOWN:
            src = g.warg < 0 || pos + (unsigned)g.warg >= w ? l : l + (unsigned)g.warg;
            break;
        case KVG_EMU_WARP_SHFL_UP:
            src = g.warg < 0 || pos < (unsigned)g.warg ? l : l - (unsigned)g.warg;
            break;
        }
        if (!(mask >> src & 1u) || !lane_live(base, src)) {
            snprintf(msg, sizeof msg, "thread %u (lane %u) in %s with mask 0x%08x reads lane %u, "
                     "but lane %u %s (the value would be undefined on a GPU)", base + l, l,
                     warp_kind_name(kind), mask, src, src,
                     !(mask >> src & 1u) ? "is outside the mask"
                     : base + src >= L.n ? "does not exist (a partial warp)" : "has exited");
            kernel_fatal(msg);
        }
        g.wresult = L.fibers[base + src].wvalue;
    }
    for (unsigned l = 0; l < 32; l++)
        if ((mask >> l & 1u) && lane_live(base, l))
            L.fibers[base + l].state = RUNNABLE;
    strict::warp_op(base / 32);
    return true;
}

/* Nothing can run: complete a warp operation whose missing lanes have exited since,
 * release a complete __syncthreads, or report the deadlock. */
void stall()
{
    for (unsigned i = 0; i < L.n; i++)
        if (L.fibers[i].state == WAIT_WARP && try_complete(i - i % 32, L.fibers[i].wmask))
            return;
    if (L.block_waiters && L.block_waiters == L.n - L.done) {
        release_block();
        return;
    }
    /* Say where the threads are, grouped: "16 threads from (0,0,0) wait in ..." */
    std::vector<std::pair<std::string, unsigned>> places;   /* what -> first thread */
    std::vector<unsigned> counts;
    for (unsigned i = 0; i < L.n; i++) {
        std::string w = where(i);
        w = w.substr(w.find(") ") + 2);
        size_t k = 0;
        while (k < places.size() && places[k].first != w)
            k++;
        if (k == places.size()) {
            places.emplace_back(w, i);
            counts.push_back(0);
        }
        counts[k]++;
    }
    std::string msg = "deadlock: no thread can continue (a barrier that not every thread it "
                      "waits for reaches):";
    for (size_t k = 0; k < places.size() && k < 8; k++) {
        const uint3 &t = L.fibers[places[k].second].tid;
        char head[96];
        snprintf(head, sizeof head, " %u thread%s from (%u,%u,%u) ", counts[k],
                 counts[k] == 1 ? "" : "s", t.x, t.y, t.z);
        std::string w = places[k].first;
        if (counts[k] > 1 && w.compare(0, 6, "waits ") == 0)
            w = "wait " + w.substr(6);
        else if (counts[k] > 1 && w.compare(0, 4, "has ") == 0)
            w = "have " + w.substr(4);
        msg += head + w + ";";
    }
    kernel_fatal(msg.c_str());
}

void run_block()
{
    unsigned bx = blockDim.x, by = blockDim.y;
    for (unsigned i = 0; i < L.n; i++) {
        Fiber &f = L.fibers[i];
        f.state = RUNNABLE;
        f.tid = uint3{i % bx, (i / bx) % by, i / (bx * by)};
        prepare(i);
    }
    L.done = 0;
    L.block_waiters = 0;
    strict::block_begin();
    L.order.resize(L.n);
    for (unsigned i = 0; i < L.n; i++)
        L.order[i] = i;
    /* Each round resumes every runnable fiber once, in a fresh random order: between two
     * barriers a thread runs to its next barrier, so the order of rounds is the order in
     * which the threads' barrier intervals run. */
    while (L.done < L.n) {
        bool ran = false;
        shuffle(L.order);
        for (unsigned i : L.order) {
            if (L.fibers[i].state != RUNNABLE)
                continue;
            resume(i);
            ran = true;
            if (L.fibers[i].state == DONE)
                L.done++;
        }
        if (!ran)
            stall();
    }
}

Fiber &running(const char *what)
{
    if (!L.active)
        fatal("%s called outside a kernel", what);
    return L.fibers[L.cur];
}

}  // namespace
}  // namespace kvg_emu

using namespace kvg_emu;

void kvg_emu_syncthreads(const char *file, int line)
{
    Fiber &f = running("__syncthreads");
    f.state = WAIT_BLOCK;
    f.bar_file = file;
    f.bar_line = line;
    L.block_waiters++;
    if (L.block_waiters == L.n - L.done) {
        /* the last to arrive: nobody else can run, release and go on */
        release_block();
        return;
    }
    park();
}

uint64_t kvg_emu_warp_op(int kind, unsigned mask, uint64_t value, int arg, int width)
{
    Fiber &f = running(warp_kind_name(kind));
    unsigned lane = L.cur % 32, base = L.cur - lane;
    char msg[256];
    if (!(mask >> lane & 1u)) {
        snprintf(msg, sizeof msg, "thread %u calls %s with mask 0x%08x, which leaves out its "
                 "own lane %u", L.cur, warp_kind_name(kind), mask, lane);
        kernel_fatal(msg);
    }
    if (kind != KVG_EMU_WARP_SYNC && kind != KVG_EMU_WARP_BALLOT &&
        (width < 1 || width > 32 || (width & (width - 1)))) {
        snprintf(msg, sizeof msg, "thread %u calls %s with width %d (not a power of 2 <= 32)",
                 L.cur, warp_kind_name(kind), width);
        kernel_fatal(msg);
    }
    f.state = WAIT_WARP;
    f.wkind = kind;
    f.wmask = mask;
    f.wvalue = value;
    f.warg = arg;
    f.wwidth = width;
    if (!try_complete(base, mask))
        park();
    return f.wresult;
}

void *kvg_emu_dynamic_smem(void)
{
    running("kvg_emu_dynamic_smem");
    return L.smem;
}

namespace kvg_emu {
namespace {

/* Runs a queued launch: every block, in a random order, each block's threads as fibers. */
void run_launch(const char *name, dim3 grid, dim3 block, size_t dyn_smem, void (*fn)(void *),
                void *ctx, size_t ctx_size, uint64_t seed)
{
    if (L.active)
        fatal("kernel launch from inside a kernel (%s)", name);
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    L.name = name;
    L.fn = fn;
    L.ctx = ctx;
    L.n = (unsigned)threads;
    L.rng = seed;
    L.shuffle = seed != 0;
    if (L.fibers.size() < L.n)
        L.fibers.resize(L.n);
    for (unsigned i = 0; i < L.n; i++)
        L.fibers[i].stack = stack_for(i);
    /* Exactly dyn_smem bytes, so ASan catches a kernel running past its shared memory
     * (none: NULL, so a kernel that uses it without asking for it faults). */
    void *smem = nullptr;
    if (dyn_smem && posix_memalign(&smem, 16, dyn_smem))
        fatal("cannot allocate %zu bytes of dynamic shared memory", dyn_smem);
    L.smem = (char *)smem;
    L.smem_size = dyn_smem;
    blockDim = block;
    gridDim = grid;
    L.active = true;
    strict::launch_begin(ctx, ctx_size, smem, dyn_smem);
    size_t n_blocks = (size_t)grid.x * grid.y * grid.z;
    std::vector<unsigned> blocks;
    bool ordered = !L.shuffle || n_blocks > (1u << 24);
    if (!ordered) {
        blocks.resize(n_blocks);
        for (size_t b = 0; b < n_blocks; b++)
            blocks[b] = (unsigned)b;
        shuffle(blocks);
    }
    for (size_t b = 0; b < n_blocks; b++) {
        size_t id = ordered ? b : blocks[b];
        blockIdx = uint3{(unsigned)(id % grid.x), (unsigned)(id / grid.x % grid.y),
                         (unsigned)(id / ((size_t)grid.x * grid.y))};
        if (dyn_smem)
            memset(L.smem, 0xA5, dyn_smem);
        run_block();
    }
    strict::launch_end();
    L.active = false;
    free(smem);
    L.smem = nullptr;
}

}  // namespace

bool in_fiber_stack(uintptr_t a)
{
    for (char *s : all_stacks())
        if (a >= (uintptr_t)s && a < (uintptr_t)s + STACK_SIZE)
            return true;
    return false;
}

void kernel_fatal_msg(const char *what)
{
    kernel_fatal(what);
}

}  // namespace kvg_emu

const char *kvg_emu_kernel_name(const char *kernel, const char *launcher)
{
    static std::set<std::string> names;
    std::lock_guard<std::recursive_mutex> guard(lock());
    return names.insert(std::string(kernel) + " (launched by " + launcher + ")").first->c_str();
}

void kvg_emu_launch_raw(const char *name, dim3 grid, dim3 block, size_t dyn_smem,
                        cudaStream_t stream, void (*fn)(void *), void *ctx,
                        void (*release)(void *), size_t ctx_size)
{
    std::lock_guard<std::recursive_mutex> guard(lock());
    if (L.active)
        fatal("kernel launch from inside a kernel (%s)", name);
    cudaError_t err = cudaSuccess;
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (cudaError_t e = device_state()) {
        injected("launch", 0);
        err = e;
    } else if (int ie = injected("launch", cudaErrorLaunchOutOfResources)) {
        err = (cudaError_t)ie;
    } else if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z ||
               block.x > 1024 || block.y > 1024 || block.z > 64 || threads > 1024 ||
               grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        err = cudaErrorInvalidConfiguration;
    } else if (dyn_smem > (48u << 10)) {
        err = cudaErrorInvalidValue;
    } else if (!valid_stream(stream)) {
        err = cudaErrorInvalidResourceHandle;
    }
    if (err != cudaSuccess) {
        record(err);
        release(ctx);
        return;
    }
    /* The captured arguments live as long as the queued launch, or the graph that
     * recorded it (a graph launch runs a copy of it each time). */
    std::shared_ptr<void> args(ctx, release);
    on_stream(stream, [=]() {
        /* The schedule's seed: the run's (KVG_EMU_SEED) mixed with the number of the launch
         * run, so a run is reproducible and each launch, each replay of a graph too, gets
         * its own orders. */
        uint64_t base = schedule_seed();
        uint64_t seed = base ? base * 0x100000001b3ull + (uint64_t)++launches : 0;
        run_launch(name, grid, block, dyn_smem, fn, args.get(), ctx_size, seed);
    });
}

extern "C" long kvg_emu_switches(void)
{
    return L.switches;
}
