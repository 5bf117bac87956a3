/* Stop strings across token boundaries: the streamed output always stays a prefix of
 * the final answer (the text before the earliest stop), whatever the split. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tap.h"
#include "stop_match.h"

static uint64_t rs = 99;
static unsigned rnd(unsigned n)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)(rs >> 33) % n;
}

/* The expected result computed the obvious way over the whole text: the first stop
 * to complete (smallest end), longest at equal ends, then lowest index. */
static size_t ref_cut(const char *text, const char *const *stops, int n, int *which)
{
    size_t tl = strlen(text), best_end = (size_t)-1, best_len = 0;
    *which = -1;
    for (int i = 0; i < n; i++) {
        const char *hit = strstr(text, stops[i]);
        size_t l = strlen(stops[i]);
        if (!hit)
            continue;
        size_t e = (size_t)(hit - text) + l;
        if (e < best_end || (e == best_end && l > best_len)) {
            best_end = e;
            best_len = l;
            *which = i;
        }
    }
    return *which < 0 ? tl : best_end - best_len;
}

/* Streams text cut at the given points; checks the prefix property at every feed. */
static int run_split(const char *text, const char *const *stops, int n, const size_t *cuts,
                     int n_cuts, char *got, size_t *got_len, int *which)
{
    kvg_stop_match m;
    char out[1024], err[128];
    int which_ref;
    size_t want = ref_cut(text, stops, n, &which_ref), prev = 0, tl = strlen(text);
    *got_len = 0;
    if (kvg_stop_init(&m, stops, NULL, n, err, sizeof err) != 0)
        return -1;
    for (int c = 0; c <= n_cuts; c++) {
        size_t end = c < n_cuts ? cuts[c] : tl;
        long w = kvg_stop_feed(&m, text + prev, end - prev, out, sizeof out);
        if (w < 0)
            return -1;
        memcpy(got + *got_len, out, (size_t)w);
        *got_len += (size_t)w;
        if (*got_len > want || memcmp(got, text, *got_len) != 0)
            return -2;           /* leaked part of a stop string */
        prev = end;
    }
    long w = kvg_stop_flush(&m, out, sizeof out);
    memcpy(got + *got_len, out, (size_t)w);
    *got_len += (size_t)w;
    *which = m.matched;
    if (*which != which_ref)
        return -3;
    return *got_len == want && memcmp(got, text, want) == 0 ? 0 : -4;
}

static void check_all_splits(const char *name, const char *text, const char *const *stops, int n)
{
    size_t tl = strlen(text), cuts[64], gl;
    char got[1024];
    int which, bad = 0, tried = 0;
    /* every single cut point, every pair of cut points, every byte its own token */
    for (size_t a = 0; a <= tl; a++)
        for (size_t b = a; b <= tl; b++) {
            cuts[0] = a;
            cuts[1] = b;
            tried++;
            if (run_split(text, stops, n, cuts, 2, got, &gl, &which) != 0)
                bad++;
        }
    for (size_t i = 0; i < tl && i < 64; i++)
        cuts[i] = i + 1;
    tried++;
    if (run_split(text, stops, n, cuts, (int)(tl < 64 ? tl : 64), got, &gl, &which) != 0)
        bad++;
    ok(bad == 0, "%s: %d splits, all give the text before the earliest stop", name, tried);
}

int main(void)
{
    kvg_stop_match m;
    char out[1024], err[128];
    long w;

    {
        const char *s[] = { "END" };
        check_all_splits("simple", "hello END world", s, 1);
    }
    {
        const char *s[] = { "abab" };
        check_all_splits("overlapping prefix abab in xababab", "xababab", s, 1);
        check_all_splits("abab absent in abaXbab", "abaXbababa", s, 1);
    }
    {
        const char *s[] = { "aab" };
        check_all_splits("self-overlap aab in aaab", "zaaab tail", s, 1);
    }
    {
        const char *s[] = { "world", "lo w", "\n\n", "o" };
        check_all_splits("four stops, first to complete wins", "hello world\n\n", s, 4);
    }
    {
        const char *s[] = { "\xe2\x82\xac\xe2\x82\xac", "\xc3\xa9t\xc3\xa9" };
        check_all_splits("utf-8 stops", "un \xc3\xa9t\xc3\xa9 \xe2\x82\xac\xe2\x82\xac", s, 2);
    }
    {
        const char *s[] = { "nothere", "zz" };
        check_all_splits("no match: all text flushed", "text ending in z", s, 2);
    }

    /* the matched index and the exact bytes, token by token */
    {
        const char *s[] = { "STOP", "OP!" };
        ok(kvg_stop_init(&m, s, NULL, 2, err, sizeof err) == 0, "init");
        w = kvg_stop_feed(&m, "abc S", 5, out, sizeof out);
        ok(w == 4 && memcmp(out, "abc ", 4) == 0, "'S' held back");
        w = kvg_stop_feed(&m, "T", 1, out, sizeof out);
        is_int(w, 0, "'ST' held back");
        w = kvg_stop_feed(&m, "OP! more", 8, out, sizeof out);
        is_int(w, 0, "match emits nothing more");
        is_int(m.matched, 0, "STOP (completing first) wins over OP!");
        is_int(kvg_stop_feed(&m, "x", 1, out, sizeof out), 0, "after a match, nothing");
        is_int(kvg_stop_flush(&m, out, sizeof out), 0, "after a match, flush gives nothing");
    }
    {
        const char *s[] = { "ab" };
        ok(kvg_stop_init(&m, s, NULL, 1, err, sizeof err) == 0, "init ab");
        w = kvg_stop_feed(&m, "xa", 2, out, sizeof out);
        is_int(w, 1, "trailing a held");
        is_int(kvg_stop_feed(&m, "xa", 2, out, 2), -1, "cap too small rejected");
        is_int(m.n_hold, 1, "unchanged after a rejected feed");
        w = kvg_stop_flush(&m, out, sizeof out);
        ok(w == 1 && out[0] == 'a', "flush releases the held a");
    }
    {
        ok(kvg_stop_init(&m, NULL, NULL, 0, err, sizeof err) == 0, "no stops");
        w = kvg_stop_feed(&m, "abc", 3, out, sizeof out);
        is_int(w, 3, "no stops: everything passes at once");
    }

    /* errors */
    {
        const char *s5[] = { "a", "b", "c", "d", "e" };
        ok(kvg_stop_init(&m, s5, NULL, 5, err, sizeof err) == -1 && strstr(err, "at most 4"),
           "5 stops rejected: %s", err);
        const char *se[] = { "a", "" };
        ok(kvg_stop_init(&m, se, NULL, 2, err, sizeof err) == -1 && strstr(err, "empty"),
           "empty stop rejected: %s", err);
        char big[KVG_STOP_MAX_LEN + 2];
        memset(big, 'x', sizeof big - 1);
        big[sizeof big - 1] = 0;
        const char *sb[] = { big };
        ok(kvg_stop_init(&m, sb, NULL, 1, err, sizeof err) == -1 && strstr(err, "more than"),
           "too long stop rejected: %s", err);
        size_t lens[] = { 2 };
        const char *sz[] = { "a\0b" };
        ok(kvg_stop_init(&m, sz, lens, 1, err, sizeof err) == 0, "explicit length with NUL");
        w = kvg_stop_feed(&m, "xa\0b", 4, out, sizeof out);
        ok(w == 1 && m.matched == 0, "a stop containing NUL matches: %ld", w);
    }

    /* random texts over a tiny alphabet, random stops, random splits */
    {
        int bad = 0;
        for (int iter = 0; iter < 3000; iter++) {
            char text[64], st[4][8], got[1024];
            const char *sp[4];
            size_t tl = 1 + rnd(40), cuts[64], gl;
            int ns = rnd(5), nc = 0, which;
            for (size_t i = 0; i < tl; i++)
                text[i] = "ab\xc3\xa9"[rnd(3)];
            text[tl] = 0;
            for (int i = 0; i < ns; i++) {
                int l = 1 + rnd(5);
                for (int j = 0; j < l; j++)
                    st[i][j] = "ab"[rnd(2)];
                st[i][l] = 0;
                sp[i] = st[i];
            }
            for (size_t p = 1; p < tl; p++)
                if (rnd(3) == 0)
                    cuts[nc++] = p;
            if (run_split(text, sp, ns, cuts, nc, got, &gl, &which) != 0)
                bad++;
        }
        ok(bad == 0, "3000 random streams agree with the reference (%d bad)", bad);
    }
    return done_testing();
}
