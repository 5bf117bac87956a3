/* Pre-tokenizer splits (GPT-2, Llama 3, Qwen2) on inputs where the regexes'
 * alternation order, greediness and the \s+(?!\S) lookahead matter, plus the
 * GPT-2 byte <-> code point mapping. Expected splits were worked out by hand
 * from the regexes and cross-checked against Perl's regex engine (which shares
 * the \s = White_Space, \p{L}, \p{N} and (?i) semantics of the reference
 * engines). */
#include <stdint.h>

#include "tap.h"
#include "tok_internal.h"

#define MAXP 64

struct pieces {
    const char *p[MAXP];
    size_t len[MAXP];
    size_t n;
    int overflow, empty;
};

static int collect(void *ctx, const char *s, size_t len)
{
    struct pieces *ps = ctx;
    if (len == 0)
        ps->empty = 1;
    if (ps->n == MAXP) {
        ps->overflow = 1;
        return 0;
    }
    ps->p[ps->n] = s;
    ps->len[ps->n] = len;
    ps->n++;
    return 0;
}

/* Pieces joined with '|' (no test input contains '|'). */
static void joined(const struct pieces *ps, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < ps->n; i++) {
        if (i && o + 1 < cap)
            out[o++] = '|';
        for (size_t k = 0; k < ps->len[i] && o + 1 < cap; k++)
            out[o++] = ps->p[i][k];
    }
    out[o] = '\0';
}

static const char *kind_name(int kind)
{
    return kind == KVG_PRETOK_GPT2 ? "gpt2" : kind == KVG_PRETOK_LLAMA3 ? "llama3" : "qwen2";
}

static void check(int kind, const char *in, const char *want)
{
    struct pieces ps = { .n = 0 };
    char got[1024];
    size_t n = strlen(in);
    int rc = kvg_pretok_split(kind, in, n, collect, &ps);
    joined(&ps, got, sizeof got);
    /* Pieces must tile the input: contiguous, in order, non-empty. */
    size_t off = 0;
    int tiled = !ps.overflow && !ps.empty;
    for (size_t i = 0; i < ps.n && tiled; i++) {
        tiled = ps.p[i] == in + off;
        off += ps.len[i];
    }
    tiled = tiled && off == n;
    char name[160];
    snprintf(name, sizeof name, "%s: \"%.60s\"", kind_name(kind), in);
    for (char *c = name; *c; c++)       /* keep TAP lines on one line */
        if (*c == '\n' || *c == '\r')
            *c = '~';
    ok(rc == 0 && tiled && strcmp(got, want) == 0, "%s", name);
    if (strcmp(got, want) != 0)
        diag("  got  [%s]\n#   want [%s]", got, want);
}

/* Same expectation for all three kinds. */
static void check_all(const char *in, const char *want)
{
    check(KVG_PRETOK_GPT2, in, want);
    check(KVG_PRETOK_LLAMA3, in, want);
    check(KVG_PRETOK_QWEN2, in, want);
}

static void test_common(void)
{
    check_all("", "");
    check_all("Hello world", "Hello| world");
    check_all("Hello, world!", "Hello|,| world|!");
    check_all("I'm you'll they're we've he'd it's can't",
              "I|'m| you|'ll| they|'re| we|'ve| he|'d| it|'s| can|'t");
    /* \s+(?!\S): all but the last space, which goes with the next word. */
    check_all("   Hello", "  | Hello");
    check_all("a  b", "a| | b");
    check_all("hi  ", "hi|  ");
    check_all(" ", " ");
    check_all("Führer café", "Führer| café");
    check_all("нещо на Български", "нещо| на| Български");
    check_all("我想在apple工作", "我想在apple工作");
    /* Emoji, ZWJ and variation selectors are neither letters nor numbers. */
    check_all("😶‍🌫️ ok", "😶‍🌫️| ok");
    /* A contraction only at the start of a match: inside a run of other
     * characters the apostrophe is just punctuation. */
    check_all("!'s", "!'|s");
    check_all(" 's", " '|s");
    check_all("''s", "''|s");
    check_all("'sam", "'s|am");
    check_all("x'", "x|'");
    /* U+001C..U+001F are not White_Space (Python's isspace would say yes);
     * U+200B and U+FEFF are not either. */
    check_all("a\x1c\x1c", "a|\x1c\x1c");
    check_all("a \xe2\x80\x8b", "a| \xe2\x80\x8b");
    /* U+3000 and U+2003 are White_Space. */
    check_all("\xe3\x80\x80\xe3\x80\x80", "\xe3\x80\x80\xe3\x80\x80");
    check_all("a\xe2\x80\x83\xe2\x80\x83", "a|\xe2\x80\x83\xe2\x80\x83");
}

static void test_gpt2(void)
{
    int k = KVG_PRETOK_GPT2;
    check(k, "12345 678", "12345| 678");
    check(k, "w048 7tuijk", "w|048| 7|tuijk");
    check(k, "  \n\n x", "  \n\n| x");
    check(k, "\n\n\n", "\n\n\n");
    check(k, "x\n\n\ny", "x|\n\n|\n|y");
    check(k, "!!!\n\nfoo", "!!!|\n|\n|foo");
    check(k, "a \tb", "a| |\t|b");
    check(k, "\t\tHello", "\t|\t|Hello");
    check(k, "    Hello\n    Hello", "   | Hello|\n   | Hello");
    check(k, "hi \n", "hi| \n");
    /* Case-sensitive contractions. */
    check(k, "DON'T 'S", "DON|'|T| '|S");
    check(k, "it'\xc5\xbf", "it|'|\xc5\xbf");
    check(k, " 🦙.cpp", " 🦙.|cpp");
    check(k, "½²3", "½²3");
    /* A combining mark is not a letter: it splits a decomposed word. */
    check(k, "cafe\xcc\x81 x", "cafe|\xcc\x81| x");
    check(k, "e\xcc\x81t", "e|\xcc\x81|t");
    /* Only U+0020 is the optional prefix, not other spaces. */
    check(k, "a\xc2\xa0" "b", "a|\xc2\xa0|b");
    check(k, "a\xc2\xa0\xc2\xa0" "b", "a|\xc2\xa0|\xc2\xa0|b");
    check(k, "a\xc2\x85" "b", "a|\xc2\x85|b");
    check(k, "$1,000.50", "$|1|,|000|.|50");
    check(k, "' era", "'| era");
}

static void test_llama3(void)
{
    int k = KVG_PRETOK_LLAMA3;
    check(k, "12345 678", "123|45| |678");
    check(k, "1234567", "123|456|7");
    check(k, "w048 7tuijk", "w|048| |7|tuijk");
    check(k, "  \n\n x", "  \n\n| x");
    check(k, "x\n\n\ny", "x|\n\n\n|y");
    check(k, "!!!\n\nfoo", "!!!\n\n|foo");
    check(k, "word!\r\n\r\nx", "word|!\r\n\r\n|x");
    check(k, "hello\r\nworld", "hello|\r\n|world");
    check(k, "a \tb", "a| |\tb");
    check(k, "\t\tHello", "\t|\tHello");
    check(k, "    Hello\n    Hello", "   | Hello|\n|   | Hello");
    check(k, "hi \n", "hi| \n");
    check(k, "hi \n  ", "hi| \n|  ");
    check(k, "\n\tx", "\n|\tx");
    /* Case-insensitive contractions, U+017F (long s) included. */
    check(k, "DON'T 'S 'Re 'LL", "DON|'T| '|S| '|Re| '|LL");
    check(k, "it'\xc5\xbf", "it|'\xc5\xbf");
    /* One non-letter, non-digit, non-newline character joins a word. */
    check(k, "'hello", "'hello");
    check(k, "(hello)", "(hello|)");
    check(k, " 🦙.cpp", " 🦙.|cpp");
    check(k, "🦙cpp", "🦙cpp");
    check(k, "½²3", "½²3");
    check(k, "٣٤٥٦", "٣٤٥|٦");
    check(k, "cafe\xcc\x81 x", "cafe|\xcc\x81| x");
    check(k, "e\xcc\x81t", "e|\xcc\x81t");
    check(k, "a\xc2\xa0" "b", "a|\xc2\xa0" "b");
    check(k, "a\x1c" "b", "a|\x1c" "b");
    check(k, "$1,000.50", "$|1|,|000|.|50");
    check(k, "!?\n", "!?\n");
    check(k, " !?\n\n ", " !?\n\n| ");
}

static void test_qwen2(void)
{
    int k = KVG_PRETOK_QWEN2;
    check(k, "12345 678", "1|2|3|4|5| |6|7|8");
    check(k, "x2024y", "x|2|0|2|4|y");
    check(k, "½²3", "½|²|3");
    /* Otherwise the same as Llama 3. */
    check(k, "  \n\n x", "  \n\n| x");
    check(k, "DON'T 'S", "DON|'T| '|S");
    check(k, "(hello)", "(hello|)");
    check(k, "!!!\n\nfoo", "!!!\n\n|foo");
}

static int stop_at_second(void *ctx, const char *s, size_t len)
{
    (void)s;
    (void)len;
    int *calls = ctx;
    return ++*calls == 2 ? 7 : 0;
}

static void test_emit_stop(void)
{
    int calls = 0;
    int rc = kvg_pretok_split(KVG_PRETOK_GPT2, "a b c d", 7, stop_at_second, &calls);
    is_int(rc, 7, "a non-zero emit return is propagated");
    is_int(calls, 2, "and stops the split");
    calls = 0;
    rc = kvg_pretok_split(KVG_PRETOK_LLAMA3, "a b c d", 7, stop_at_second, &calls);
    ok(rc == 7 && calls == 2, "same for llama3");
}

/* Pieces always tile the input, whatever it is (invalid UTF-8 included). */
static void test_random_tiling(void)
{
    static const char *pal[] = {
        "a", "Z", "0", "9", " ", " ", "\t", "\n", "\r", "'", "s", "ll", "!", ".",
        "\xc3\xa9", "\xcc\x81", "\xe4\xb8\xad", "\xf0\x9f\xa6\x99", "\xc2\xa0",
        "\xe3\x80\x80", "\xc2\xbd", "\xe2\x80\x8d", "\xc5\xbf", "\xff", "\xe4\xb8",
    };
    uint32_t seed = 12345;
    int bad = 0;
    for (int iter = 0; iter < 3000; iter++) {
        char buf[256];
        size_t n = 0;
        seed = seed * 1103515245u + 12345u;
        int parts = (int)((seed >> 16) % 20);
        for (int p = 0; p < parts; p++) {
            seed = seed * 1103515245u + 12345u;
            const char *e = pal[(seed >> 16) % (sizeof pal / sizeof pal[0])];
            size_t el = strlen(e);
            memcpy(buf + n, e, el);
            n += el;
        }
        for (int kind = KVG_PRETOK_GPT2; kind <= KVG_PRETOK_QWEN2; kind++) {
            struct pieces ps = { .n = 0 };
            kvg_pretok_split(kind, buf, n, collect, &ps);
            size_t off = 0;
            int tiled = !ps.overflow && !ps.empty;
            for (size_t i = 0; i < ps.n && tiled; i++) {
                tiled = ps.p[i] == buf + off;
                off += ps.len[i];
            }
            if (!tiled || off != n)
                bad++;
        }
    }
    is_int(bad, 0, "9000 random inputs: pieces are non-empty and tile the input");
}

static void test_bytes_to_unicode(void)
{
    is_int(kvg_byte_to_cp(' '), 0x120, "space -> U+0120 (\xc4\xa0)");
    is_int(kvg_byte_to_cp('\n'), 0x10A, "newline -> U+010A (\xc4\x8a)");
    is_int(kvg_byte_to_cp(0), 0x100, "NUL -> U+0100");
    is_int(kvg_byte_to_cp('a'), 'a', "printable ASCII is itself");
    is_int(kvg_byte_to_cp(0x7F), 0x121, "DEL -> U+0121");
    is_int(kvg_byte_to_cp(0xA0), 0x142, "NBSP -> U+0142");
    is_int(kvg_byte_to_cp(0xA1), 0xA1, "0xA1 is itself");
    is_int(kvg_byte_to_cp(0xAD), 0x143, "soft hyphen -> U+0143");
    is_int(kvg_byte_to_cp(0xFF), 0xFF, "0xFF is itself");

    int seen[0x144 + 1] = { 0 }, bijective = 1;
    for (int b = 0; b < 256; b++) {
        uint32_t cp = kvg_byte_to_cp((unsigned char)b);
        if (cp > 0x143 || seen[cp]++ || kvg_cp_to_byte(cp) != b)
            bijective = 0;
    }
    ok(bijective, "byte_to_cp is a bijection onto its image and cp_to_byte inverts it");
    is_int(kvg_cp_to_byte(' '), -1, "U+0020 is not in the mapping");
    is_int(kvg_cp_to_byte(0xAD), -1, "U+00AD is not in the mapping");
    is_int(kvg_cp_to_byte(0x144), -1, "U+0144 is not in the mapping");
    is_int(kvg_cp_to_byte(0x2581), -1, "U+2581 is not in the mapping");
}

int main(void)
{
    test_common();
    test_gpt2();
    test_llama3();
    test_qwen2();
    test_emit_stop();
    test_random_tiling();
    test_bytes_to_unicode();
    return done_testing();
}
