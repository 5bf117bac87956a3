/* The strict checks of emulated kernels: pointer provenance and data races.
 *
 * How accesses are seen: the kernels' translation units are compiled with
 * -fsanitize=kernel-address and the call threshold at 0 (Makefile, EMU_STRICT_FLAGS), which
 * makes g++ call __asan_{load,store}{1,2,4,8,16,N}_noabort(addr) before every memory
 * access it cannot prove is to a register-held local. KASan's runtime lives in a kernel;
 * here these functions are ours. They do nothing outside a kernel (the same translation
 * units hold the host-side launchers), and inside one:
 *
 * Provenance. The address must be (in the order tried):
 *   - the running thread's own stack (its locals: a register file and local memory);
 *   - the launch's captured arguments, or the index variables (read only);
 *   - the launch's dynamic shared memory, or the program's writable static data, where
 *     every `__shared__` array lives in the emulation (blocks run one at a time);
 *   - the program's read-only data (constants: read only);
 *   - inside a device allocation (cudaMalloc).
 * Anything else is a host pointer, another thread's stack or pinned host memory: fatal,
 * naming the kernel, the thread and the address. (Mapped pinned memory is legal on a GPU
 * but slow over PCIe; no kvgate kernel means to touch it.) The one host memory this cannot
 * tell from shared memory is the program's own static data: static `__shared__` arrays
 * live among it (template instances' statics go to COMDAT sections that no section
 * attribute can gather), so a kernel given a pointer to a host global is checked as if it
 * used shared memory. Host pointers in practice are heap and stack, which are caught.
 *
 * Races. A shadow word per 2 bytes of shared and device memory records the last write and
 * the last read: the barrier interval (a number, fresh for each block and after each
 * __syncthreads), the thread, and the warp's count of completed warp operations. Two
 * accesses conflict when at least one writes and:
 *   - shared memory: the same interval, different threads, and not lanes of one warp with
 *     a warp operation (__syncwarp, a shuffle, a vote) completed between them;
 *   - device memory: the same, or different blocks of the same launch (blocks are not
 *     ordered: only a later launch sees a block's writes).
 * A read of shared memory that no thread of the block has written yet is reported too (on
 * a GPU it is whatever the last block left there). Atomics are exempt (cuda_emu.h
 * checks their provenance only). The detector keeps one reader per word, so it may miss a
 * race between two readers and a writer; it never reports a race the schedule could not
 * have. Warp counts are 16-bit: two accesses exactly 65,536 warp operations apart in one
 * interval would look unordered.
 *
 * KVG_EMU_STRICT=0 turns both checks off (a plain speed comparison, or bisecting). The
 * ASan build does not use this file's hooks: its kernels carry ASan's own instrumentation,
 * which takes the same compiler hooks; its strictness is the randomized schedule and the
 * stream model. */
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_emu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define KVG_EMU_STRICT_HOOKS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVG_EMU_STRICT_HOOKS 0
#endif
#endif
#ifndef KVG_EMU_STRICT_HOOKS
#define KVG_EMU_STRICT_HOOKS 1
#endif

namespace kvg_emu {
namespace strict {

Now now;

namespace {

struct Shadow {
    uint32_t w_int, r_int;       /* interval of the last write / read; 0: none */
    uint16_t w_tid, r_tid;       /* the thread (linear index in its block) */
    uint16_t w_wc, r_wc;         /* its warp's count of completed warp operations then */
};
static_assert(sizeof(Shadow) == 16, "a shadow word is 16 bytes per 2 bytes watched");

enum Kind { K_READONLY, K_SHARED, K_DEVICE };

struct Region {
    uintptr_t lo = 0, hi = 0;
    int kind = K_READONLY;
    Shadow *shadow = nullptr;    /* K_SHARED, K_DEVICE */
    const char *what = "";
};

struct ImageSeg {
    uintptr_t lo, hi;
    bool writable;
    Shadow *shadow;
};

struct State {
    bool inited = false;
    bool enabled = true;
    std::vector<ImageSeg> image;
    std::unordered_map<uintptr_t, std::pair<Shadow *, size_t>> device;   /* base -> shadow */
    Region launch_regions[3];    /* captured arguments, index variables, dynamic smem */
    int n_launch_regions = 0;
    std::vector<Shadow> smem_shadow;
    Region cache[4];
    unsigned cache_next = 0;
    uint32_t interval = 0;       /* the current one */
    uint32_t launch_base = 0;    /* the first interval of this launch */
    uint32_t block_first = 0;    /* the first interval of this block */
    uint16_t warp_count[32];
};

State S;

Shadow *map_shadow(size_t bytes)
{
    size_t n = (bytes + 1) / 2 * sizeof(Shadow);
    void *m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED)
        fatal("strict mode: cannot map %zu bytes of shadow memory", n);
    return (Shadow *)m;
}

int image_segment(struct dl_phdr_info *info, size_t, void *)
{
    if (info->dlpi_name && info->dlpi_name[0])
        return 1;                /* the main program is the first entry; stop after it */
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) &ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_LOAD)
            continue;
        ImageSeg seg;
        seg.lo = info->dlpi_addr + ph.p_vaddr;
        seg.hi = seg.lo + ph.p_memsz;
        seg.writable = (ph.p_flags & PF_W) != 0;
        seg.shadow = seg.writable ? map_shadow(seg.hi - seg.lo) : nullptr;
        S.image.push_back(seg);
    }
    return 1;
}

void init()
{
    if (S.inited)
        return;
    S.inited = true;
    const char *v = getenv("KVG_EMU_STRICT");
    S.enabled = !(v && strcmp(v, "0") == 0);
    dl_iterate_phdr(image_segment, nullptr);
}

/* Every shadow forgotten: the interval numbers start again. */
void wipe_all()
{
    for (ImageSeg &seg : S.image)
        if (seg.shadow)
            madvise(seg.shadow, (seg.hi - seg.lo + 1) / 2 * sizeof(Shadow), MADV_DONTNEED);
    for (auto &d : S.device)
        madvise(d.second.first, (d.second.second + 1) / 2 * sizeof(Shadow), MADV_DONTNEED);
    S.interval = 0;
}

[[noreturn]] void report(const char *what, uintptr_t a, size_t n)
{
    char msg[600];
    snprintf(msg, sizeof msg, "thread (%u,%u,%u) %s (address %p, %zu bytes)", threadIdx.x,
             threadIdx.y, threadIdx.z, what, (void *)a, n);
    kernel_fatal_msg(msg);
}

bool find_region(uintptr_t a, Region *out)
{
    for (int i = 0; i < S.n_launch_regions; i++)
        if (a - S.launch_regions[i].lo < S.launch_regions[i].hi - S.launch_regions[i].lo) {
            *out = S.launch_regions[i];
            return true;
        }
    for (const ImageSeg &seg : S.image)
        if (a >= seg.lo && a < seg.hi) {
            out->lo = seg.lo;
            out->hi = seg.hi;
            out->kind = seg.writable ? K_SHARED : K_READONLY;
            out->shadow = seg.shadow;
            out->what = seg.writable ? "static shared memory" : "read-only data";
            return true;
        }
    uintptr_t lo;
    size_t size;
    if (device_allocation(a, &lo, &size)) {
        auto it = S.device.find(lo);
        if (it == S.device.end())
            it = S.device.emplace(lo, std::make_pair(map_shadow(size), size)).first;
        out->lo = lo;
        out->hi = lo + size;
        out->kind = K_DEVICE;
        out->shadow = it->second.first;
        out->what = "device memory";
        return true;
    }
    return false;
}

/* Does the recorded access (interval, thread, warp count) race with the running thread? */
inline bool conflicts(int kind, uint32_t other_int, unsigned other_tid, unsigned other_wc)
{
    if (other_int == 0 || other_int < S.launch_base)
        return false;                            /* none, or an earlier launch's */
    if (other_int < S.block_first)
        return kind == K_DEVICE;                 /* another block of this launch */
    if (other_int != S.interval || other_tid == now.tid)
        return false;                            /* ordered by a barrier, or itself */
    unsigned warp = now.tid / 32;
    if (other_tid / 32 == warp && other_wc != S.warp_count[warp])
        return false;                            /* a warp operation ordered them */
    return true;
}

void race(const char *verb, const Region &r, uintptr_t a, size_t n, uint32_t other_int, unsigned other_tid,
          const char *other_verb)
{
    char what[400];
    if (other_int < S.block_first)
        snprintf(what, sizeof what, "%s %s that another block %s in the same launch (blocks are not "
                 "ordered: a cross-block race)", verb, r.what, other_verb);
    else
        snprintf(what, sizeof what, "%s %s that thread %u %s in the same barrier interval (a race: "
                 "a __syncthreads is missing between them)", verb, r.what, other_tid, other_verb);
    report(what, a, n);
}

}  // namespace

void access(uintptr_t a, size_t n, bool write)
{
    if (a - now.stack_lo < now.stack_size)
        return;
    Region r;
    bool hit = false;
    for (const Region &c : S.cache)
        if (a - c.lo < c.hi - c.lo) {
            r = c;
            hit = true;
            break;
        }
    if (!hit) {
        if (!find_region(a, &r)) {
            if (in_fiber_stack(a))
                report("touches another thread's stack (local memory is private)", a, n);
            if (pinned_allocation(a))
                report("touches pinned host memory (cudaMallocHost): kernels read device memory", a, n);
            report("touches memory that is not device memory (cudaMalloc), shared memory, its own "
                   "stack or its arguments: a host pointer in a kernel", a, n);
        }
        S.cache[S.cache_next++ % 4] = r;
    }
    if (a + n > r.hi)
        report(write ? "writes past the end of an allocation" : "reads past the end of an allocation", a, n);
    if (r.kind == K_READONLY) {
        if (write)
            report(r.what[0] ? "writes read-only memory (its arguments or constants)"
                             : "writes read-only memory", a, n);
        return;
    }
    unsigned warp = now.tid / 32;
    uint16_t wc = S.warp_count[warp];
    size_t g0 = (a - r.lo) / 2, g1 = (a + n - 1 - r.lo) / 2;
    for (size_t g = g0; g <= g1; g++) {
        Shadow &s = r.shadow[g];
        if (!write) {
            if (conflicts(r.kind, s.w_int, s.w_tid, s.w_wc))
                race("reads", r, a, n, s.w_int, s.w_tid, "wrote");
            if (r.kind == K_SHARED && s.w_int < S.block_first)
                report("reads shared memory that no thread of this block has written (on a GPU: "
                       "garbage, or what another block left)", a, n);
            s.r_int = S.interval;
            s.r_tid = (uint16_t)now.tid;
            s.r_wc = wc;
        } else {
            if (conflicts(r.kind, s.w_int, s.w_tid, s.w_wc))
                race("writes", r, a, n, s.w_int, s.w_tid, "wrote");
            if (conflicts(r.kind, s.r_int, s.r_tid, s.r_wc))
                race("writes", r, a, n, s.r_int, s.r_tid, "read");
            s.w_int = S.interval;
            s.w_tid = (uint16_t)now.tid;
            s.w_wc = wc;
        }
    }
}

void reset()
{
    init();
    const char *v = getenv("KVG_EMU_STRICT");
    S.enabled = !(v && strcmp(v, "0") == 0);
}

void launch_begin(const void *ctx, size_t ctx_size, const void *smem, size_t smem_size)
{
    init();
    now.checking = S.enabled && KVG_EMU_STRICT_HOOKS;
    if (!now.checking)
        return;
    if (S.interval > 0xF0000000u)
        wipe_all();
    S.launch_base = S.interval + 1;
    Region &p = S.launch_regions[0];
    p.lo = (uintptr_t)ctx;
    p.hi = p.lo + ctx_size;
    p.kind = K_READONLY;
    p.what = "its arguments";
    Region &ix = S.launch_regions[1];
    ix.lo = (uintptr_t)&kvg_emu_idx;
    ix.hi = ix.lo + sizeof kvg_emu_idx;
    ix.kind = K_READONLY;
    ix.what = "the index variables";
    S.n_launch_regions = 2;
    if (smem_size) {
        S.smem_shadow.assign((smem_size + 1) / 2, Shadow{});
        Region &d = S.launch_regions[2];
        d.lo = (uintptr_t)smem;
        d.hi = d.lo + smem_size;
        d.kind = K_SHARED;
        d.shadow = S.smem_shadow.data();
        d.what = "dynamic shared memory";
        S.n_launch_regions = 3;
    }
    for (Region &c : S.cache)
        c = Region{};
}

void block_begin()
{
    if (!now.checking)
        return;
    S.block_first = ++S.interval;
    memset(S.warp_count, 0, sizeof S.warp_count);
}

void barrier()
{
    if (now.checking)
        ++S.interval;
}

void warp_op(unsigned warp)
{
    if (now.checking)
        S.warp_count[warp % 32]++;
}

void launch_end()
{
    now.checking = false;
    now.in_kernel = false;
}

void atomic_access(const void *p, size_t n)
{
    if (!now.in_kernel || !now.checking)
        return;
    uintptr_t a = (uintptr_t)p;
    Region r;
    if (!find_region(a, &r) || r.kind == K_READONLY || a + n > r.hi)
        report("makes an atomic access outside device or shared memory", a, n);
}

}  // namespace strict

void forget_shadow(void *dev)
{
    auto it = strict::S.device.find((uintptr_t)dev);
    if (it == strict::S.device.end())
        return;
    munmap(it->second.first, (it->second.second + 1) / 2 * sizeof(strict::Shadow));
    strict::S.device.erase(it);
    for (strict::Region &c : strict::S.cache)
        c = strict::Region{};
}

}  // namespace kvg_emu

void kvg_emu_atomic_check(const void *p, size_t n)
{
    kvg_emu::strict::atomic_access(p, n);
}

#if KVG_EMU_STRICT_HOOKS
using kvg_emu::strict::now;

#define KVG_EMU_HOOK(size)                                                       \
    extern "C" void __asan_load##size##_noabort(void *p)                        \
    {                                                                            \
        if (now.checking && now.in_kernel)                                       \
            kvg_emu::strict::access((uintptr_t)p, size, false);                  \
    }                                                                            \
    extern "C" void __asan_store##size##_noabort(void *p)                       \
    {                                                                            \
        if (now.checking && now.in_kernel)                                       \
            kvg_emu::strict::access((uintptr_t)p, size, true);                   \
    }
KVG_EMU_HOOK(1)
KVG_EMU_HOOK(2)
KVG_EMU_HOOK(4)
KVG_EMU_HOOK(8)
KVG_EMU_HOOK(16)

extern "C" void __asan_loadN_noabort(void *p, long n)
{
    if (now.checking && now.in_kernel && n > 0)
        kvg_emu::strict::access((uintptr_t)p, (size_t)n, false);
}

extern "C" void __asan_storeN_noabort(void *p, long n)
{
    if (now.checking && now.in_kernel && n > 0)
        kvg_emu::strict::access((uintptr_t)p, (size_t)n, true);
}

extern "C" void __asan_handle_no_return(void) {}
#endif
