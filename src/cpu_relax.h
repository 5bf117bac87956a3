/* The CPU's spin-wait hint, for the short busy-waits of the thread pool and the
 * daemon's busy-poll (it lets a sibling hyperthread run and saves power). */
#ifndef KVG_CPU_RELAX_H
#define KVG_CPU_RELAX_H

static inline void kvg_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif
