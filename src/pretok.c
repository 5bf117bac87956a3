/* Byte-level pre-tokenizers: the GPT-2, Llama 3 and Qwen2 split regexes,
 * hand-compiled into scanners.
 *
 * Each scanner follows the regex's semantics exactly: at every position the
 * alternatives are tried in order and the first that matches wins (leftmost-
 * first, greedy quantifiers, backtracking only where a later element forces
 * it). Working out where backtracking lands gives closed forms:
 *   \s+(?!\S)        a whitespace run up to the end of the text, or all but its
 *                    last character when something follows (which needs two
 *                    or more characters; one character falls to the final \s+).
 *   \s*[\r\n]+       a whitespace run cut after its last \r or \n.
 * so no general regex machinery is needed.
 *
 * Character classes follow the reference engines (Oniguruma in HF tokenizers,
 * Rust regex in tiktoken): \p{L} = general category L*, \p{N} = N*, and \s =
 * the Unicode White_Space property (not Python's isspace, which adds
 * U+001C..U+001F). ASCII goes through a table; the rest through utf8proc. */
#include <utf8proc.h>

#include "tok_internal.h"
#include "ucd_extra.h"
#include "utf8.h"

enum { C_O = 0, C_L, C_N, C_WS, C_NL };   /* other, letter, number, space, \r \n */

/* C_O is zero so that everything not listed is "other". */
static const uint8_t ascii_class[128] = {
    ['\t'] = C_WS, ['\n'] = C_NL, ['\v'] = C_WS, ['\f'] = C_WS, ['\r'] = C_NL,
    [' '] = C_WS,
    ['0' ... '9'] = C_N,
    ['A' ... 'Z'] = C_L,
    ['a' ... 'z'] = C_L,
};

static int class_of_cp(uint32_t cp)
{
    switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
        return C_WS;
    default:
        break;
    }
    if (cp >= 0x2000 && cp <= 0x200A)
        return C_WS;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
        return C_L;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        return C_N;
    case UTF8PROC_CATEGORY_CN:
        /* assigned since utf8proc's tables: the reference knows them */
        switch (kvg_ucd_extra_ln(cp)) {
        case 1: return C_L;
        case 2: return C_N;
        default: return C_O;
        }
    default:
        return C_O;
    }
}

/* Invalid UTF-8 is outside the contract, but a stray byte must still make
 * progress and stay covered: it counts as one "other" character. */
static __attribute__((noinline)) int class_slow(const unsigned char *s, size_t n, size_t i,
                                                size_t *len)
{
    uint32_t cp;
    int l = kvg_utf8_decode(s + i, n - i, &cp);
    if (l == 0) {
        *len = 1;
        return C_O;
    }
    *len = (size_t)l;
    return class_of_cp(cp);
}

static inline int class_at(const unsigned char *s, size_t n, size_t i, size_t *len)
{
    if (s[i] < 0x80) {
        *len = 1;
        return ascii_class[s[i]];
    }
    return class_slow(s, n, i, len);
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SWAR_LETTERS 1
/* Number of leading ASCII letters in the 8 bytes at s (0..8). Letter runs are
 * the bulk of the text, and this finds a word's end without a data-dependent
 * branch per byte. A byte >= 0x80 can carry into the bytes after it, but never
 * into those before it, and it is itself a stop, so the count stays exact. */
static inline unsigned ascii_letters8(const unsigned char *s)
{
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    uint64_t x;
    __builtin_memcpy(&x, s, 8);
    uint64_t y = x | (0x20 * ones);                 /* 'A'-'Z' -> 'a'-'z' */
    uint64_t ge_a = y + (0x80 - 'a') * ones;        /* bit 7 set: >= 'a' */
    uint64_t gt_z = y + (0x80 - 'z' - 1) * ones;    /* bit 7 set: >  'z' */
    uint64_t stop = (~ge_a | gt_z | x) & high;
    return stop ? (unsigned)__builtin_ctzll(stop) >> 3 : 8;
}
#endif

/* End of the run of class `c` characters starting at i. */
static inline size_t run_end(const unsigned char *s, size_t n, size_t i, int c)
{
#ifdef SWAR_LETTERS
    if (c == C_L) {
        while (i + 8 <= n) {
            unsigned k = ascii_letters8(s + i);
            i += k;
            if (k < 8)
                break;
        }
    }
#endif
    for (;;) {
        while (i < n && s[i] < 0x80 && ascii_class[s[i]] == c)
            i++;
        if (i >= n || s[i] < 0x80)
            return i;
        size_t l;
        if (class_slow(s, n, i, &l) != c)
            return i;
        i += l;
    }
}

static inline size_t skip_crlf(const unsigned char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == '\r' || s[i] == '\n'))
        i++;
    return i;
}

/* 's 't 're 've 'm 'll 'd at i (s[i] == '\''): returns the end, or 0.
 * Case-insensitively (Llama 3 / Qwen2) 'S etc. match too, and so does U+017F
 * LATIN SMALL LETTER LONG S, whose case fold is 's' in both reference engines. */
static size_t contraction(const unsigned char *s, size_t n, size_t i, int icase)
{
    if (i + 1 >= n)
        return 0;
    unsigned char a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
    if (icase) {
        if (a == 0xC5 && b == 0xBF)
            return i + 3;
        a = (unsigned char)(a | 0x20);      /* only 'A'-'Z' map onto 'a'-'z' */
        b = (unsigned char)(b | 0x20);
    }
    switch (a) {
    case 's': case 't': case 'm': case 'd':
        return i + 2;
    case 'r': case 'v':
        return b == 'e' ? i + 3 : 0;
    case 'l':
        return b == 'l' ? i + 3 : 0;
    default:
        return 0;
    }
}

/* \s+(?!\S) then \s+, from i (whitespace): see the header comment. */
static size_t space_run(const unsigned char *s, size_t n, size_t i)
{
    size_t j = i, last = i, l;
    while (j < n) {
        int c = class_at(s, n, j, &l);
        if (c != C_WS && c != C_NL)
            break;
        last = j;
        j += l;
    }
    if (j == n || last == i)
        return j;
    return last;
}

static int split_gpt2(const unsigned char *s, size_t n, kvg_pretok_emit emit, void *ctx)
{
    size_t i = 0;
    while (i < n) {
        size_t l, l2, j;
        int c = class_at(s, n, i, &l);

        if (c == C_L || c == C_N) {
            j = run_end(s, n, i + l, c);
        } else if (c == C_O) {
            if (s[i] != '\'' || (j = contraction(s, n, i, 0)) == 0)
                j = run_end(s, n, i + l, C_O);
        } else if (s[i] == ' ' && i + 1 < n
                   && (c = class_at(s, n, i + 1, &l2)) != C_WS && c != C_NL) {
            j = run_end(s, n, i + 1 + l2, c);       /* " ?" before L, N or other */
        } else {
            j = space_run(s, n, i);
        }
        int rc = emit(ctx, (const char *)s + i, j - i);
        if (rc)
            return rc;
        i = j;
    }
    return 0;
}

/* Llama 3 (max_digits 3) and Qwen2 (max_digits 1). */
static int split_llama3(const unsigned char *s, size_t n, size_t max_digits,
                        kvg_pretok_emit emit, void *ctx)
{
    size_t i = 0;
    while (i < n) {
        size_t l, l2, j;
        int c = class_at(s, n, i, &l);

        if (c == C_L) {
            j = run_end(s, n, i + l, C_L);
        } else if (s[i] == '\'' && (j = contraction(s, n, i, 1)) != 0) {
            /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
        } else if (c != C_N && c != C_NL && i + l < n
                   && class_at(s, n, i + l, &l2) == C_L) {
            j = run_end(s, n, i + l + l2, C_L);     /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        } else if (c == C_N) {
            j = i + l;
            for (size_t k = 1; k < max_digits && j < n; k++) {
                if (class_at(s, n, j, &l2) != C_N)
                    break;
                j += l2;
            }
        } else if (c == C_O) {
            j = skip_crlf(s, n, run_end(s, n, i + l, C_O));
        } else if (s[i] == ' ' && i + 1 < n && class_at(s, n, i + 1, &l2) == C_O) {
            j = skip_crlf(s, n, run_end(s, n, i + 1 + l2, C_O));
        } else {
            /* Whitespace: \s*[\r\n]+ ends the match after the run's last \r or \n;
             * without one, \s+(?!\S) and \s+ as for GPT-2. */
            size_t last = i, nl_end = 0;
            j = i;
            while (j < n) {
                c = class_at(s, n, j, &l2);
                if (c == C_NL)
                    nl_end = j + 1;
                else if (c != C_WS)
                    break;
                last = j;
                j += l2;
            }
            if (nl_end)
                j = nl_end;
            else if (j < n && last > i)
                j = last;
        }
        int rc = emit(ctx, (const char *)s + i, j - i);
        if (rc)
            return rc;
        i = j;
    }
    return 0;
}

int kvg_pretok_split(int kind, const char *s, size_t n, kvg_pretok_emit emit, void *ctx)
{
    const unsigned char *u = (const unsigned char *)s;
    switch (kind) {
    case KVG_PRETOK_GPT2:
        return split_gpt2(u, n, emit, ctx);
    case KVG_PRETOK_LLAMA3:
        return split_llama3(u, n, 3, emit, ctx);
    case KVG_PRETOK_QWEN2:
        return split_llama3(u, n, 1, emit, ctx);
    default:
        return n ? emit(ctx, s, n) : 0;
    }
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves; the
 * other 68 (controls, space, DEL, C1, NBSP, soft hyphen) are moved, in byte
 * order, to U+0100.. so that every piece is printable text. */
static int byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

uint32_t kvg_byte_to_cp(unsigned char b)
{
    if (byte_is_printable(b))
        return b;
    /* Count the non-printable bytes below b. */
    if (b <= 0x20)
        return 0x100u + b;
    if (b <= 0xA0)
        return 0x100u + 0x21 + (b - 0x7Fu);
    return 0x100u + 0x21 + 0x22;                /* 0xAD */
}

int kvg_cp_to_byte(uint32_t cp)
{
    if (cp < 0x100)
        return byte_is_printable(cp) ? (int)cp : -1;
    if (cp < 0x100 + 0x21)
        return (int)(cp - 0x100);
    if (cp < 0x100 + 0x21 + 0x22)
        return (int)(cp - 0x100 - 0x21 + 0x7F);
    if (cp == 0x100 + 0x21 + 0x22)
        return 0xAD;
    return -1;
}
