#include "utf8.h"

int kvg_utf8_seq_len(unsigned char c)
{
    if (c < 0x80)
        return 1;
    if (c < 0xC2)
        return 0;               /* continuation byte or overlong 2-byte lead */
    if (c < 0xE0)
        return 2;
    if (c < 0xF0)
        return 3;
    if (c < 0xF5)
        return 4;
    return 0;
}

int kvg_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    int len;
    uint32_t c;

    if (n == 0)
        return 0;
    len = kvg_utf8_seq_len(s[0]);
    if (len == 0 || (size_t)len > n)
        return 0;
    if (len == 1) {
        *cp = s[0];
        return 1;
    }
    c = s[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && c < 0x800) || (len == 4 && c < 0x10000) || c > 0x10FFFF
        || (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    *cp = c;
    return len;
}

int kvg_utf8_encode(uint32_t cp, unsigned char *out)
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t kvg_utf8_invalid_at(const unsigned char *s, size_t n)
{
    size_t i = 0;
    uint32_t cp;

    while (i < n) {
        /* Prompts are mostly ASCII: skip 8 bytes at a time while no high bit is set. */
        while (i + 8 <= n) {
            uint64_t w;
            __builtin_memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int len = kvg_utf8_decode(s + i, n - i, &cp);
        if (len == 0)
            return i;
        i += (size_t)len;
    }
    return (size_t)-1;
}
