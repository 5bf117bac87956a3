#include "nfc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "utf8.h"

/* Segments are usually one character plus a mark or two; the stack buffer covers
 * all real text and the heap only sees pathological runs of marks. */
#define STACK_CPS 256
/* Longest canonical decomposition of one code point is 4 (t/unit/nfc.c checks). */
#define MAX_DECOMP 8
/* Runs of marks longer than this are ordered by counting sort instead of insertion. */
#define SHORT_RUN 16
/* As utf8proc_NFC(): STABLE is what keeps composition exclusions (U+1D160, U+0958)
 * decomposed when composing. */
#define NFC_OPTS (UTF8PROC_STABLE | UTF8PROC_COMPOSE)
#define HANGUL_S_FIRST 0xAC00
#define HANGUL_S_LAST 0xD7A3

typedef struct {
    int32_t *cp;
    size_t n, cap;
    int32_t stack[STACK_CPS];
    int32_t *tmp;               /* counting-sort destination, grown on demand */
    size_t tmp_cap;
    const unsigned char *verbatim; /* source bytes of a one-character segment that */
    size_t verbatim_len;           /* did not decompose: copied, not re-encoded */
    unsigned char *out;
    size_t o, ocap;
    char *err;
    size_t err_len;
} nfc_state;

static int is_hangul_vt(uint32_t cp)
{
    return (cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2);
}

static int boundary_p(uint32_t cp, const utf8proc_property_t *p)
{
    if (p->combining_class != 0)
        return 0;
    if (p->category == UTF8PROC_CATEGORY_MN || p->category == UTF8PROC_CATEGORY_MC
        || p->category == UTF8PROC_CATEGORY_ME)
        return 0;
    return !is_hangul_vt(cp);
}

int kvg_nfc_boundary(uint32_t cp)
{
    if (cp < 0x80)
        return 1;
    if (cp > 0x10FFFF)
        return 0;
    return boundary_p(cp, utf8proc_get_property((utf8proc_int32_t)cp));
}

size_t kvg_nfc_bound(const unsigned char *in, size_t len)
{
    size_t high = 0;

    for (size_t i = 0; i < len; i++)
        high += in[i] >> 7;
    if (high > (SIZE_MAX - len) / 2)
        return SIZE_MAX;
    return len + 2 * high;
}

static int fail(nfc_state *st, const char *msg)
{
    if (st->err && st->err_len)
        snprintf(st->err, st->err_len, "%s", msg);
    return -1;
}

static int grow(nfc_state *st, size_t more)
{
    size_t want;
    int32_t *p;

    if (st->n > (SIZE_MAX / sizeof(int32_t) - more) / 2)
        return fail(st, "NFC: segment too long");
    want = 2 * (st->n + more);
    if (st->cp == st->stack) {
        p = malloc(want * sizeof(int32_t));
        if (p)
            memcpy(p, st->stack, st->n * sizeof(int32_t));
    } else {
        p = realloc(st->cp, want * sizeof(int32_t));
    }
    if (!p)
        return fail(st, "NFC: out of memory for the scratch buffer");
    st->cp = p;
    st->cap = want;
    return 0;
}

static int reserve(nfc_state *st, size_t more)
{
    return st->cap - st->n >= more ? 0 : grow(st, more);
}

static unsigned ccc(int32_t cp)
{
    return utf8proc_get_property(cp)->combining_class;
}

/* Canonical ordering: a stable sort by combining class of each run of non-starters.
 * Short runs (the normal case) use insertion sort; long ones a counting sort, so a
 * megabyte of alternating marks stays linear. */
static int sort_run(nfc_state *st, size_t a, size_t b)
{
    int32_t *v = st->cp;
    size_t count[256], pos[256], sum = 0;

    if (b - a <= SHORT_RUN) {
        for (size_t i = a + 1; i < b; i++) {
            int32_t x = v[i];
            unsigned cx = ccc(x);
            size_t j = i;
            while (j > a && ccc(v[j - 1]) > cx) {
                v[j] = v[j - 1];
                j--;
            }
            v[j] = x;
        }
        return 0;
    }
    if (st->tmp_cap < b - a) {
        int32_t *p = realloc(st->tmp, (b - a) * sizeof(int32_t));
        if (!p)
            return fail(st, "NFC: out of memory for the scratch buffer");
        st->tmp = p;
        st->tmp_cap = b - a;
    }
    memset(count, 0, sizeof(count));
    for (size_t i = a; i < b; i++)
        count[ccc(v[i])]++;
    for (int c = 0; c < 256; c++) {
        pos[c] = sum;
        sum += count[c];
    }
    for (size_t i = a; i < b; i++)
        st->tmp[pos[ccc(v[i])]++] = v[i];
    memcpy(v + a, st->tmp, (b - a) * sizeof(int32_t));
    return 0;
}

static int emit(nfc_state *st, int32_t cp)
{
    if (st->ocap - st->o < 4) {
        unsigned char tmp[4];
        int l = kvg_utf8_encode((uint32_t)cp, tmp);
        if (st->ocap - st->o < (size_t)l)
            return fail(st, "NFC: output larger than the buffer");
        memcpy(st->out + st->o, tmp, (size_t)l);
        st->o += (size_t)l;
        return 0;
    }
    st->o += (size_t)kvg_utf8_encode((uint32_t)cp, st->out + st->o);
    return 0;
}

static int flush(nfc_state *st)
{
    size_t i = 0;
    utf8proc_ssize_t n;

    if (st->n == 0)
        return 0;
    if (st->n == 1 && st->verbatim) {
        if (st->ocap - st->o < st->verbatim_len)
            return fail(st, "NFC: output larger than the buffer");
        memcpy(st->out + st->o, st->verbatim, st->verbatim_len);
        st->o += st->verbatim_len;
        st->n = 0;
        return 0;
    }
    if (st->n > 1) {
        while (i < st->n) {
            size_t j;
            if (ccc(st->cp[i]) == 0) {
                i++;
                continue;
            }
            for (j = i + 1; j < st->n && ccc(st->cp[j]) != 0; j++)
                ;
            if (j - i > 1 && sort_run(st, i, j) < 0)
                return -1;
            i = j;
        }
        n = utf8proc_normalize_utf32(st->cp, (utf8proc_ssize_t)st->n, NFC_OPTS);
        if (n < 0)
            return fail(st, utf8proc_errmsg(n));
        st->n = (size_t)n;
    }
    for (i = 0; i < st->n; i++)
        if (emit(st, st->cp[i]) < 0)
            return -1;
    st->n = 0;
    return 0;
}

/* Whether NFC would decompose cp at all (a compatibility mapping does not count). */
static int decomposes(uint32_t cp, const utf8proc_property_t *p)
{
    return (p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0)
        || (cp >= HANGUL_S_FIRST && cp <= HANGUL_S_LAST);
}

static int append(nfc_state *st, uint32_t cp, const utf8proc_property_t *p)
{
    int boundclass = 0;
    utf8proc_ssize_t r;

    if (reserve(st, MAX_DECOMP) < 0)
        return -1;
    /* Most characters have no canonical decomposition (none at all, or only a
     * compatibility one, which NFC ignores): skip utf8proc's general-purpose call. */
    if (!decomposes(cp, p)) {
        st->cp[st->n++] = (int32_t)cp;
        return 0;
    }
    r = utf8proc_decompose_char((utf8proc_int32_t)cp, st->cp + st->n,
                                (utf8proc_ssize_t)(st->cap - st->n), NFC_OPTS, &boundclass);
    if (r < 0)
        return fail(st, utf8proc_errmsg(r));
    if ((size_t)r > st->cap - st->n) {
        if (reserve(st, (size_t)r) < 0)
            return -1;
        r = utf8proc_decompose_char((utf8proc_int32_t)cp, st->cp + st->n,
                                    (utf8proc_ssize_t)(st->cap - st->n), NFC_OPTS,
                                    &boundclass);
        if (r < 0)
            return fail(st, utf8proc_errmsg(r));
    }
    st->n += (size_t)r;
    return 0;
}

/* Index of the first non-ASCII byte in s[i..n), or n. */
static size_t ascii_end(const unsigned char *s, size_t i, size_t n)
{
    while (n - i >= 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ull)
            break;
        i += 8;
    }
    while (i < n && s[i] < 0x80)
        i++;
    return i;
}

static int run(nfc_state *st, const unsigned char *in, size_t len)
{
    size_t i = 0;

    while (i < len) {
        const utf8proc_property_t *p;
        uint32_t cp;
        int l;

        if (in[i] < 0x80) {
            size_t j = ascii_end(in, i, len);
            /* The last ASCII character before a non-ASCII one may take marks, so it
             * opens the next segment instead of being copied. */
            size_t copy_end = j < len ? j - 1 : j;
            if (flush(st) < 0)
                return -1;
            if (st->ocap - st->o < copy_end - i)
                return fail(st, "NFC: output larger than the buffer");
            memcpy(st->out + st->o, in + i, copy_end - i);
            st->o += copy_end - i;
            if (j < len) {
                st->cp[0] = in[j - 1];
                st->n = 1;
                st->verbatim = in + j - 1;
                st->verbatim_len = 1;
            }
            i = j;
            continue;
        }
        l = kvg_utf8_decode(in + i, len - i, &cp);
        if (l == 0) {
            if (st->err && st->err_len)
                snprintf(st->err, st->err_len, "invalid UTF-8 at byte offset %zu", i);
            return -1;
        }
        p = utf8proc_get_property((utf8proc_int32_t)cp);
        if (boundary_p(cp, p)) {
            if (flush(st) < 0)
                return -1;
            st->verbatim = decomposes(cp, p) ? NULL : in + i;
            st->verbatim_len = (size_t)l;
        } else {
            st->verbatim = NULL;
        }
        if (append(st, cp, p) < 0)
            return -1;
        i += (size_t)l;
    }
    return flush(st);
}

int kvg_nfc(const unsigned char *in, size_t len, unsigned char *out, size_t cap,
            size_t *out_len, char *err, size_t err_len)
{
    nfc_state st;
    int rc;

    st.cp = st.stack;
    st.n = 0;
    st.cap = STACK_CPS;
    st.tmp = NULL;
    st.verbatim = NULL;
    st.verbatim_len = 0;
    st.tmp_cap = 0;
    st.out = out;
    st.o = 0;
    st.ocap = cap;
    st.err = err;
    st.err_len = err_len;
    rc = run(&st, in, len);
    if (st.cp != st.stack)
        free(st.cp);
    free(st.tmp);
    if (rc == 0)
        *out_len = st.o;
    return rc;
}
