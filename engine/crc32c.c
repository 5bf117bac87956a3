/* CRC32C: see crc32c.h. */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

static uint32_t table[256];
static int have_sse42;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;   /* reflected 0x1EDC6F41 */
        table[i] = c;
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#else
    have_sse42 = 0;
#endif
}

static uint32_t crc_table(uint32_t c, const uint8_t *p, size_t n)
{
    while (n--)
        c = table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2")))
static uint32_t crc_sse42(uint32_t c, const uint8_t *p, size_t n)
{
    uint64_t c64 = c;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
    }
    c = (uint32_t)c64;
    for (; n; n--)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

uint32_t kvg_crc32c(uint32_t crc, const void *data, size_t n)
{
    uint32_t c = ~crc;
    pthread_once(&once, init);
#if defined(__x86_64__)
    if (have_sse42)
        return ~crc_sse42(c, data, n);
#endif
    return ~crc_table(c, data, n);
}
