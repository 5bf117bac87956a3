/* The CPU backend's mixture-of-experts FFN (moe_cpu.c), which backend_cpu.c's moe
 * operation calls. */
#ifndef KVG_MOE_CPU_H
#define KVG_MOE_CPU_H

#include "cpu/cpu_context.h"

/* The MoE layers' scratch for m (NULL when m is dense, or out of memory), grown to a
 * step's rows by kvg_cpu_moe_reserve (0, or -1 out of memory), and backend.h's moe
 * operation. */
typedef struct kvg_cpu_moe kvg_cpu_moe;
kvg_cpu_moe *kvg_cpu_moe_new(const kvg_model *m);
int kvg_cpu_moe_reserve(kvg_cpu_moe *mo, int rows);
void kvg_cpu_moe_free(kvg_cpu_moe *mo);
void kvg_cpu_moe_ffn(kvg_cpu *c, int layer, const float *x, int rows, float *out);

#endif
