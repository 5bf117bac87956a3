#include "vote.h"
#include "vote_testing.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "nfc.h"
#include "utf8.h"

/* ---- character classes ---- */

static int is_ws(uint32_t cp)
{
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85)
        return 1;
    if (cp < 0x80)
        return 0;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
        return 1;
    default:
        return 0;
    }
}

static int is_trailing_punct(uint32_t cp)
{
    switch (cp) {
    case '.': case ',': case ';': case ':': case '!': case '?':
    case 0x3002: case 0xFF0E: case 0xFF0C: case 0x3001: case 0xFF1B: case 0xFF1A:
    case 0xFF01: case 0xFF1F: case 0x2026:
        return 1;
    default:
        return 0;
    }
}

/* Wrapping pairs: symmetric ones (same character both ends) and brackets. */
static uint32_t closer_of(uint32_t open, int *symmetric)
{
    *symmetric = 0;
    switch (open) {
    case '"': case '\'': case '`': case '*':
        *symmetric = 1;
        return open;
    case 0x201C: return 0x201D;     /* “ ” */
    case 0x2018: return 0x2019;     /* ‘ ’ */
    case 0x00AB: return 0x00BB;     /* « » */
    case '(': return ')';
    case '[': return ']';
    case '{': return '}';
    case 0x300C: return 0x300D;     /* 「 」 */
    default: return 0;
    }
}

static int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int is_alnum(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Decodes the code point at s[i] (invalid bytes: U+FFFD, one byte). */
static size_t decode_at(const unsigned char *s, size_t n, size_t i, uint32_t *cp)
{
    int l = kvg_utf8_decode(s + i, n - i, cp);
    if (l <= 0) {
        *cp = 0xFFFD;
        return 1;
    }
    return (size_t)l;
}

/* The start of the code point that ends at s[end) (end > 0). */
static size_t prev_start(const unsigned char *s, size_t start, size_t end)
{
    size_t i = end - 1;
    while (i > start && (s[i] & 0xC0) == 0x80 && end - i < 4)
        i--;
    /* a stray continuation byte decodes as one U+FFFD byte; keep it alone */
    if (i != end - 1) {
        uint32_t cp;
        if (kvg_utf8_decode(s + i, end - i, &cp) != (int)(end - i))
            i = end - 1;
    }
    return i;
}

/* ---- the default extractor ---- */

int kvg_vote_default_answer(const char *text, size_t len, const char **ans, size_t *ans_len)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, best_s = 0, best_e = 0;
    int found = 0;

    if (!text)
        return 0;
    while (i < len) {
        size_t st, j, run;

        if (!is_digit(s[i])) {
            i++;
            continue;
        }
        st = i;
        for (j = i; j < len && is_digit(s[j]); j++)
            ;
        run = j - i;
        if (run <= 3) {
            while (j + 3 < len && s[j] == ',' && is_digit(s[j + 1]) && is_digit(s[j + 2])
                   && is_digit(s[j + 3]) && !(j + 4 < len && is_digit(s[j + 4])))
                j += 4;
        }
        if (j + 1 < len && s[j] == '.' && is_digit(s[j + 1])) {
            for (j += 1; j < len && is_digit(s[j]); j++)
                ;
        }
        if (st > 0 && s[st - 1] == '-' && !(st > 1 && is_alnum(s[st - 2])))
            st--;
        best_s = st;
        best_e = j;
        found = 1;
        i = j;
    }
    if (found) {
        *ans = text + best_s;
        *ans_len = best_e - best_s;
        return 1;
    }
    /* the last non-empty line, trimmed */
    {
        size_t end = len;
        while (end > 0) {
            size_t ls = end, a, b;
            while (ls > 0 && s[ls - 1] != '\n')
                ls--;
            a = ls;
            b = end;
            for (;;) {                      /* trim the front */
                uint32_t cp;
                size_t l;
                if (a >= b)
                    break;
                l = decode_at(s, b, a, &cp);
                if (!is_ws(cp))
                    break;
                a += l;
            }
            while (b > a) {                 /* trim the back */
                uint32_t cp;
                size_t p = prev_start(s, a, b);
                decode_at(s, b, p, &cp);
                if (!is_ws(cp))
                    break;
                b = p;
            }
            if (b > a) {
                *ans = text + a;
                *ans_len = b - a;
                return 1;
            }
            end = ls > 0 ? ls - 1 : 0;
        }
    }
    return 0;
}

/* ---- normalization ---- */

/* A number with thousands groups: -?d{1,3}(,ddd)+(.d+)? */
static int grouped_number(const char *s, size_t n)
{
    size_t i = 0, run = 0;
    int groups = 0;

    if (i < n && s[i] == '-')
        i++;
    while (i < n && is_digit((unsigned char)s[i]))
        i++, run++;
    if (run < 1 || run > 3)
        return 0;
    while (i + 3 < n && s[i] == ',' && is_digit((unsigned char)s[i + 1])
           && is_digit((unsigned char)s[i + 2]) && is_digit((unsigned char)s[i + 3])) {
        i += 4;
        groups++;
        if (i < n && is_digit((unsigned char)s[i]))
            return 0;
    }
    if (!groups)
        return 0;
    if (i < n && s[i] == '.') {
        size_t d = ++i;
        while (i < n && is_digit((unsigned char)s[i]))
            i++;
        if (i == d)
            return 0;
    }
    return i == n;
}

static uint32_t cp_at(const unsigned char *s, size_t end, size_t i)
{
    uint32_t cp;
    decode_at(s, end, i, &cp);
    return cp;
}

/* Folded bytes looked at: enough for KVG_VOTE_ANSWER_MAX bytes after NFC, which
 * shrinks a folded text by less than a third. */
#define FOLD_MAX (4 * KVG_VOTE_ANSWER_MAX)

size_t kvg_vote_normalize(const char *in, size_t len, char *out, size_t cap)
{
    const unsigned char *s = (const unsigned char *)in;
    unsigned char fold[FOLD_MAX + 64];
    unsigned char nfc[3 * sizeof fold];
    size_t a = 0, b = len, nf = 0, nn = 0, w, limit, i;
    int prev_ws = 0;
    char err[64];

    if (cap == 0)
        return 0;
    out[0] = '\0';
    if (!in)
        return 0;
    /* 1.-2. trim, trailing punctuation, wrapping pairs, until stable; on byte
     * offsets [a, b) so a long answer's real end is what gets trimmed */
    for (;;) {
        size_t a0 = a, b0 = b, pa, pb;
        uint32_t first, last, close;
        int sym;

        while (a < b && is_ws(cp_at(s, b, a)))
            a += decode_at(s, b, a, &first);
        while (b > a && is_ws(cp_at(s, b, prev_start(s, a, b))))
            b = prev_start(s, a, b);
        if (b == a)
            break;
        pb = prev_start(s, a, b);
        last = cp_at(s, b, pb);
        if (is_trailing_punct(last)) {
            b = pb;
            continue;
        }
        pa = a + decode_at(s, b, a, &first);
        if (pa <= pb && (close = closer_of(first, &sym)) && last == close) {
            int ok = 1;
            if (!sym) {
                /* the opener must be closed by the last character only */
                long depth = 0;
                for (size_t k = a; k < pb;) {
                    uint32_t cp;
                    k += decode_at(s, pb, k, &cp);
                    if (cp == first)
                        depth++;
                    else if (cp == close && --depth == 0) {
                        ok = 0;
                        break;
                    }
                }
            }
            if (ok) {
                a = pa;
                b = pb;
            }
        }
        if (a == a0 && b == b0)
            break;
    }
    /* 3.-4. collapse inner white space, case-fold into UTF-8 */
    for (i = a; i < b;) {
        utf8proc_int32_t dst[8];
        int lastbc = 0;
        utf8proc_ssize_t k;
        uint32_t cp;

        i += decode_at(s, b, i, &cp);
        if (is_ws(cp)) {
            if (!prev_ws)
                fold[nf++] = ' ';
            prev_ws = 1;
            continue;
        }
        prev_ws = 0;
        /* enough text: stop where NFC cannot join across */
        if (nf >= FOLD_MAX && kvg_nfc_boundary(cp))
            break;
        k = utf8proc_decompose_char((utf8proc_int32_t)cp, dst, 8, UTF8PROC_CASEFOLD, &lastbc);
        if (k < 0 || k > 8) {
            dst[0] = 0xFFFD;
            k = 1;
        }
        if (nf + 4 * (size_t)k > sizeof fold)
            break;
        for (utf8proc_ssize_t q = 0; q < k; q++)
            nf += (size_t)kvg_utf8_encode((uint32_t)dst[q], fold + nf);
    }
    /* NFC (the folded text is valid UTF-8: kvg_nfc_bound(fold) <= sizeof nfc) */
    if (kvg_nfc(fold, nf, nfc, sizeof nfc, &nn, err, sizeof err) < 0) {
        memcpy(nfc, fold, nf);
        nn = nf;
    }
    /* 5. thousands groups */
    if (grouped_number((const char *)nfc, nn)) {
        size_t o = 0;
        for (i = 0; i < nn; i++)
            if (nfc[i] != ',')
                nfc[o++] = nfc[i];
        nn = o;
    }
    /* cut at a character boundary */
    limit = cap - 1 < KVG_VOTE_ANSWER_MAX ? cap - 1 : KVG_VOTE_ANSWER_MAX;
    w = nn;
    if (w > limit) {
        w = limit;
        while (w > 0 && (nfc[w] & 0xC0) == 0x80)
            w--;
    }
    memcpy(out, nfc, w);
    out[w] = '\0';
    return w;
}

/* ---- the wave driver and the vote ---- */

enum { ST_UNDRAWN = 0, ST_RUNNING, ST_DONE };

typedef struct sc_answer {
    char text[KVG_VOTE_ANSWER_MAX + 1];
    size_t len;
    unsigned count;
    double weight;
    unsigned first;              /* the sample of its first vote */
} sc_answer;

struct kvg_sc {
    kvg_sc_config cfg;
    unsigned n_drawn, n_running, n_done;
    unsigned n_cancelled;        /* drawn samples that finished cancelled */
    int decided;
    unsigned char state[KVG_SC_MAX_N];
    unsigned char drawn[KVG_SC_MAX_N];
    size_t n_answers;
    sc_answer answers[];         /* cfg.n slots, kept in the tally order */
};

kvg_sc *kvg_sc_new(const kvg_sc_config *c)
{
    kvg_sc *s;
    unsigned init;

    if (!c || (c->vote != KVG_VOTE_MAJORITY && c->vote != KVG_VOTE_LOGPROB) || c->n < 1
        || c->n > KVG_SC_MAX_N || c->min_samples > c->n || !(c->agreement > 0.0)
        || !(c->agreement <= 1.0))
        return NULL;
    if (!(s = calloc(1, sizeof *s + c->n * sizeof(sc_answer))))
        return NULL;
    s->cfg = *c;
    if (s->cfg.wave == 0)
        s->cfg.wave = s->cfg.min_samples;
    init = c->min_samples ? c->min_samples : c->n;
    for (unsigned j = 0; j < init; j++) {
        s->state[j] = ST_RUNNING;
        s->drawn[j] = 1;
    }
    s->n_drawn = s->n_running = init;
    return s;
}

void kvg_sc_free(kvg_sc *s)
{
    free(s);
}

unsigned kvg_sc_initial(const kvg_sc *s)
{
    return s->cfg.min_samples ? s->cfg.min_samples : s->cfg.n;
}

/* a before b in the tally order */
static int before(const sc_answer *a, const sc_answer *b)
{
    if (a->weight != b->weight)
        return a->weight > b->weight;
    if (a->count != b->count)
        return a->count > b->count;
    return a->first < b->first;
}

static void vote(kvg_sc *s, unsigned sample, const char *ans, size_t len, double mean_logprob)
{
    double w = 1.0;
    size_t i;

    if (len > KVG_VOTE_ANSWER_MAX) {
        len = KVG_VOTE_ANSWER_MAX;
        while (len > 0 && ((unsigned char)ans[len] & 0xC0) == 0x80)
            len--;
    }
    if (s->cfg.vote == KVG_VOTE_LOGPROB) {
        if (isnan(mean_logprob))
            w = 0.0;
        else
            w = exp(mean_logprob > 0.0 ? 0.0 : mean_logprob);
    }
    for (i = 0; i < s->n_answers; i++)
        if (s->answers[i].len == len && memcmp(s->answers[i].text, ans, len) == 0)
            break;
    if (i == s->n_answers) {
        sc_answer *a = &s->answers[s->n_answers++];
        memcpy(a->text, ans, len);
        a->text[len] = '\0';
        a->len = len;
        a->first = sample;
        a->count = 0;
        a->weight = 0.0;
    }
    s->answers[i].count++;
    s->answers[i].weight += w;
    /* move it up to keep the tally order (only its votes grew) */
    while (i > 0 && before(&s->answers[i], &s->answers[i - 1])) {
        sc_answer t = s->answers[i];
        s->answers[i] = s->answers[i - 1];
        s->answers[i - 1] = t;
        i--;
    }
}

static int certain(const kvg_sc *s)
{
    double total = 0.0, lead, second;

    if (s->n_done == s->cfg.n)
        return 1;
    /* no early decision before min_samples samples have finished */
    if (s->n_done < s->cfg.min_samples || s->n_answers == 0)
        return 0;
    for (size_t i = 0; i < s->n_answers; i++)
        total += s->answers[i].weight;
    lead = s->answers[0].weight;
    second = s->n_answers > 1 ? s->answers[1].weight : 0.0;
    /* the samples still running could not overturn the lead (undrawn ones are a
       budget, not votes: they are never drawn once decided) */
    return total > 0.0 && lead >= s->cfg.agreement * total - 1e-9
        && lead - second > (double)s->n_running;
}

void kvg_sc_finished(kvg_sc *s, unsigned sample, const char *answer, size_t len,
                     double mean_logprob, int cancelled, kvg_sc_action *act)
{
    memset(act, 0, sizeof *act);
    if (sample >= s->cfg.n || s->state[sample] == ST_DONE) {
        act->decided = s->decided;
        return;
    }
    if (s->state[sample] == ST_UNDRAWN) {
        if (cancelled) {
            s->state[sample] = ST_DONE;
            s->n_done++;
        }
    } else {
        s->state[sample] = ST_DONE;
        s->n_running--;
        s->n_done++;
        s->n_cancelled += cancelled != 0;
        if (!cancelled && answer && len > 0)
            vote(s, sample, answer, len, mean_logprob);
    }
    if (s->decided) {
        act->decided = 1;
        return;
    }
    if (certain(s)) {
        s->decided = 1;
        act->decided = 1;
        if (s->n_done < s->cfg.n) {
            for (unsigned j = 0; j < s->cfg.n; j++)
                if (s->state[j] != ST_DONE)
                    act->cancel_mask |= (uint32_t)1 << j;
        }
        return;
    }
    if (s->n_running == 0 && s->n_drawn < s->cfg.n) {
        unsigned k = s->cfg.n - s->n_drawn;
        if (s->cfg.wave < k)
            k = s->cfg.wave;
        for (unsigned j = 0; j < k; j++) {
            unsigned idx = s->n_drawn + j;
            /* an undrawn sample already dropped stays finished */
            if (s->state[idx] == ST_UNDRAWN) {
                s->state[idx] = ST_RUNNING;
                s->drawn[idx] = 1;
                s->n_running++;
            }
        }
        s->n_drawn += k;
        act->draw = k;
    }
}

int kvg_sc_decided(const kvg_sc *s)
{
    return s->decided;
}

const char *kvg_sc_answer(const kvg_sc *s, size_t *len)
{
    if (s->n_answers == 0) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = s->answers[0].len;
    return s->answers[0].text;
}

size_t kvg_sc_n_answers(const kvg_sc *s)
{
    return s->n_answers;
}

void kvg_sc_answer_at(const kvg_sc *s, size_t i, const char **ans, size_t *len,
                      unsigned *count, double *weight)
{
    const sc_answer *a;

    if (i >= s->n_answers) {
        if (ans) *ans = NULL;
        if (len) *len = 0;
        if (count) *count = 0;
        if (weight) *weight = 0.0;
        return;
    }
    a = &s->answers[i];
    if (ans) *ans = a->text;
    if (len) *len = a->len;
    if (count) *count = a->count;
    if (weight) *weight = a->weight;
}

unsigned kvg_sc_samples_run(const kvg_sc *s)
{
    unsigned k = 0;
    for (unsigned j = 0; j < s->cfg.n; j++)
        k += s->drawn[j];
    return k;
}

/* What the decision saved, not that it came early: a sample whose cancel
   crossed its end ran in full, and a vote whose cancels all crossed saved
   nothing. */
int kvg_sc_stopped_early(const kvg_sc *s)
{
    return s->decided && (s->n_cancelled > 0 || kvg_sc_samples_run(s) < s->cfg.n);
}

int kvg_sc_sample_drawn(const kvg_sc *s, unsigned sample)
{
    return sample < s->cfg.n && s->drawn[sample];
}
