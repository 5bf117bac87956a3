/* Tokenizer benchmark driver (run by t/bench/tokenize, not a test).
 *
 *   tokenize_bench gen OUT [BYTES]
 *       writes BYTES (default 1 MiB) of English-like text, deterministically
 *   tokenize_bench run TEXT TOKENIZER LABEL CHUNK...
 *       encodes TEXT with TOKENIZER, for each CHUNK size (0 = the whole text in
 *       one call, otherwise prompts of at most CHUNK bytes cut back to a
 *       character boundary, the same cut t/bench/tokenize_npm.mjs makes), and
 *       prints one line per chunk size:
 *         RESULT <label> <chunk> <MB/s> <tokens/s> <tokens> <reps>
 *       MB/s is 1e6 bytes per second of CPU time, the median over the repetitions.
 *
 * The text draws words from a Zipf-distributed lexicon (a few hundred common
 * English words, then a long tail of derived and made-up words, so that word caches see
 * repeats and misses in roughly natural proportions), with punctuation,
 * numbers, quotes, a little non-ASCII punctuation and accented words, lines
 * and paragraphs. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer.h"

/* ---------------- text generator ---------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)((rng_state >> 16) % n);
}

static const char *const common[] = {
    "the", "of", "and", "to", "a", "in", "is", "it", "that", "was", "he", "for", "on",
    "are", "as", "with", "his", "they", "at", "be", "this", "from", "have", "or", "by",
    "one", "had", "not", "but", "what", "all", "were", "when", "we", "there", "can",
    "an", "your", "which", "their", "said", "if", "do", "will", "each", "about", "how",
    "up", "out", "them", "then", "she", "many", "some", "so", "these", "would", "other",
    "into", "has", "more", "her", "two", "like", "him", "see", "time", "could", "no",
    "make", "than", "first", "been", "its", "who", "now", "people", "my", "made", "over",
    "did", "down", "only", "way", "find", "use", "may", "water", "long", "little", "very",
    "after", "words", "called", "just", "where", "most", "know", "get", "through", "back",
    "much", "before", "go", "good", "new", "write", "our", "used", "me", "man", "too",
    "any", "day", "same", "right", "look", "think", "also", "around", "another", "came",
    "come", "work", "three", "word", "must", "because", "does", "part", "even", "place",
    "well", "such", "here", "take", "why", "help", "put", "different", "away", "again",
    "off", "went", "old", "number", "great", "tell", "men", "say", "small", "every",
    "found", "still", "between", "name", "should", "home", "big", "give", "air", "line",
    "set", "own", "under", "read", "last", "never", "us", "left", "end", "along", "while",
    "might", "next", "sound", "below", "saw", "something", "thought", "both", "few",
    "those", "always", "show", "large", "often", "together", "asked", "house", "don't",
    "world", "going", "want", "school", "important", "until", "form", "food", "keep",
    "children", "feet", "land", "side", "without", "boy", "once", "animals", "life",
    "enough", "took", "sometimes", "four", "head", "above", "kind", "began", "almost",
    "live", "page", "got", "earth", "need", "far", "hand", "high", "year", "mother",
    "light", "country", "father", "let", "night", "picture", "being", "study", "second",
    "soon", "story", "since", "white", "ever", "paper", "hard", "near", "sentence",
    "better", "best", "across", "during", "today", "however", "sure", "knew", "it's",
    "try", "told", "young", "sun", "thing", "whole", "hear", "example", "heard",
    "several", "change", "answer", "room", "sea", "against", "top", "turned", "learn",
    "point", "city", "play", "toward", "five", "himself", "usually", "money", "seen",
    "didn't", "car", "morning", "I'm", "body", "upon", "family", "later", "turn", "move",
    "face", "door", "cut", "done", "group", "true", "leave", "color", "red", "friends",
    "pulled", "question", "system", "government", "research", "development", "market",
    "information", "analysis", "performance", "community", "experience", "political",
    "economic", "international", "particular", "significant", "environment", "evidence",
    "understand", "necessary", "available", "structure", "relationship", "university",
    "technology", "computer", "language", "history", "science", "problem", "process",
    "they're", "we've", "you'll", "she'd", "can't", "won't", "isn't", "wasn't",
};

static const char *const proper[] = {
    "London", "Paris", "Mary", "John", "Elizabeth", "America", "Europe", "Monday",
    "December", "Thompson", "Cambridge", "Pacific", "Shakespeare", "Einstein", "Tokyo",
};

static const char *const syll[] = {
    "con", "ver", "sa", "tion", "pre", "dict", "ab", "ly", "in", "ter", "ment", "al",
    "ex", "pan", "sive", "ro", "ta", "re", "du", "ci", "ble", "ous", "ness", "mi",
    "gra", "phy", "lo", "gic", "ul", "tra", "nar", "row", "quin", "zel", "fra", "ct",
};

static const char *const rare[] = {      /* non-ASCII, used sparingly */
    "caf\xc3\xa9", "na\xc3\xafve", "r\xc3\xa9sum\xc3\xa9", "fa\xc3\xa7" "ade", "Z\xc3\xbcrich",
};

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t len)
{
    if (b->n + len > b->cap) {
        while (b->n + len > b->cap)
            b->cap = b->cap ? b->cap * 2 : 1 << 20;
        b->p = realloc(b->p, b->cap);
        if (!b->p) {
            perror("realloc");
            exit(1);
        }
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
}

static void puts_(buf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* The lexicon: the common words above (roughly in frequency order), then a
 * long tail of rarer words (below), drawn with Zipf's law (p ~ 1/rank),
 * as word frequencies in English text roughly are: the common words cover
 * about 60% of the running text and tail words repeat a few times each. */
#define N_TAIL 20000
#define N_LEX (sizeof common / sizeof *common + N_TAIL)

static char tail[N_TAIL][24];
static double lex_cdf[N_LEX];

static const char *const prefixes[] = { "un", "re", "pre", "over", "dis", "mis", "out", "under" };
static const char *const suffixes[] = {
    "s", "ed", "ing", "ly", "er", "ers", "ness", "ment", "able", "ful", "less", "ion", "ist", "ism",
};

/* Tail words are mostly derived English-looking forms (a prefix and/or a
 * suffix on a common word: "reworked", "unthinkingly"), which GPT-2 splits into
 * about as many pieces as real rare words; some are made of syllables (names,
 * jargon). */
static void lexicon_init(void)
{
    const size_t n_common = sizeof common / sizeof *common;
    for (size_t i = 0; i < N_TAIL; i++) {
        char *w = tail[i];
        w[0] = '\0';
        if (rnd(10) < 8) {
            const char *stem;
            do
                stem = common[rnd((uint32_t)n_common)];
            while (strchr(stem, '\'') || strlen(stem) < 3);
            int pre = rnd(3) == 0, suf = !pre || rnd(2);
            if (pre)
                strcat(w, prefixes[rnd(sizeof prefixes / sizeof *prefixes)]);
            strcat(w, stem);
            if (suf)
                strcat(w, suffixes[rnd(sizeof suffixes / sizeof *suffixes)]);
        } else {
            uint32_t k = 2 + rnd(2);
            for (uint32_t j = 0; j < k; j++)
                strcat(w, syll[rnd(sizeof syll / sizeof *syll)]);
        }
    }
    double sum = 0;
    for (size_t r = 0; r < N_LEX; r++)
        lex_cdf[r] = sum += 1.0 / (double)(r + 1);
    for (size_t r = 0; r < N_LEX; r++)
        lex_cdf[r] /= sum;
}

static const char *lexicon_word(void)
{
    double u = (double)rnd(1u << 30) / (double)(1u << 30);
    size_t lo = 0, hi = N_LEX - 1;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (lex_cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < sizeof common / sizeof *common ? common[lo] : tail[lo - sizeof common / sizeof *common];
}

static void word(buf *b, int capital)
{
    char w[64];
    uint32_t r = rnd(100);
    if (r < 93)
        snprintf(w, sizeof w, "%s", lexicon_word());
    else if (r < 96)
        snprintf(w, sizeof w, "%s", proper[rnd(sizeof proper / sizeof *proper)]);
    else if (r < 97)
        snprintf(w, sizeof w, "%s", rare[rnd(sizeof rare / sizeof *rare)]);
    else if (r < 99)
        snprintf(w, sizeof w, "%u", rnd(10) < 5 ? 1800 + rnd(230) : rnd(1000));
    else if (rnd(2))
        snprintf(w, sizeof w, "%u.%u", rnd(100), rnd(100));
    else
        snprintf(w, sizeof w, "%u,%03u", 1 + rnd(99), rnd(1000));
    if (capital && w[0] >= 'a' && w[0] <= 'z')
        w[0] = (char)(w[0] - 'a' + 'A');
    puts_(b, w);
}

static void sentence(buf *b)
{
    uint32_t n = 4 + rnd(18);
    int quoted = rnd(12) == 0, paren = 0;
    if (quoted)
        puts_(b, rnd(3) ? "\"" : "\xe2\x80\x9c");
    for (uint32_t i = 0; i < n; i++) {
        if (i) {
            uint32_t r = rnd(100);
            if (r < 6)
                puts_(b, ",");
            else if (r < 7)
                puts_(b, ";");
            else if (r < 8)
                puts_(b, " \xe2\x80\x94");
            else if (r < 9)
                puts_(b, ":");
            puts_(b, " ");
            if (!paren && rnd(40) == 0) {
                puts_(b, "(");
                paren = 1;
            }
        }
        word(b, i == 0);
        if (paren && rnd(4) == 0) {
            puts_(b, ")");
            paren = 0;
        }
    }
    if (paren)
        puts_(b, ")");
    uint32_t r = rnd(20);
    puts_(b, r < 16 ? "." : r < 18 ? "?" : r < 19 ? "!" : "...");
    if (quoted)
        puts_(b, rnd(3) ? "\"" : "\xe2\x80\x9d");
}

static char *generate(size_t want, size_t *len)
{
    buf b = { 0 };
    lexicon_init();
    while (b.n < want) {
        uint32_t k = 2 + rnd(7);
        for (uint32_t i = 0; i < k; i++) {
            if (i)
                puts_(&b, rnd(6) == 0 ? "\n" : " ");
            sentence(&b);
        }
        puts_(&b, "\n\n");
    }
    /* Cut to exactly `want` bytes, at a character boundary. */
    size_t n = want;
    while (n > 0 && n < b.n && ((unsigned char)b.p[n] & 0xC0) == 0x80)
        n--;
    *len = n;
    return b.p;
}

/* ---------------- timing ---------------- */

/* CPU time, not wall time: the benchmark machines are shared, and time spent
 * descheduled says nothing about the tokenizer. The driver is single-threaded. */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Next prompt end: at most `chunk` bytes on, backed off to a character start. */
static size_t cut(const char *s, size_t n, size_t at, size_t chunk)
{
    if (chunk == 0 || n - at <= chunk)
        return n;
    size_t e = at + chunk;
    while (e > at + 1 && ((unsigned char)s[e] & 0xC0) == 0x80)
        e--;
    return e;
}

/* Encodes the whole text once as prompts of `chunk` bytes; returns the tokens. */
static long long pass(const kvg_tokenizer *t, const char *s, size_t n, size_t chunk)
{
    long long tokens = 0;
    char err[256];
    for (size_t at = 0; at < n;) {
        size_t e = cut(s, n, at, chunk);
        int32_t *ids;
        size_t n_ids;
        if (kvg_tokenizer_encode(t, s + at, e - at, 0, &ids, &n_ids, err, sizeof err) != 0) {
            fprintf(stderr, "encode: %s\n", err);
            exit(1);
        }
        tokens += (long long)n_ids;
        free(ids);
        at = e;
    }
    return tokens;
}

static void run(const kvg_tokenizer *t, const char *label, const char *s, size_t n, size_t chunk)
{
    double times[64];
    int reps = 0;
    long long tokens = pass(t, s, n, chunk);        /* warm-up */
    double start = now();
    while (reps < 64 && (reps < 5 || now() - start < 1.5)) {
        double t0 = now();
        if (pass(t, s, n, chunk) != tokens) {
            fprintf(stderr, "token count changed between passes\n");
            exit(1);
        }
        times[reps++] = now() - t0;
    }
    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    double med = times[reps / 2];
    printf("RESULT %s %zu %.2f %.0f %lld %d\n", label, chunk, (double)n / med / 1e6,
           (double)tokens / med, tokens, reps);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "gen") == 0) {
        size_t want = argc > 3 ? strtoul(argv[3], NULL, 10) : 1u << 20, len;
        char *text = generate(want, &len);
        FILE *f = fopen(argv[2], "wb");
        if (!f || fwrite(text, 1, len, f) != len || fclose(f) != 0) {
            perror(argv[2]);
            return 1;
        }
        free(text);
        return 0;
    }
    if (argc >= 6 && strcmp(argv[1], "run") == 0) {
        char err[512];
        FILE *f = fopen(argv[2], "rb");
        if (!f) {
            perror(argv[2]);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *text = malloc((size_t)n + 1);
        if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) {
            perror(argv[2]);
            return 1;
        }
        fclose(f);
        kvg_tokenizer *t = kvg_tokenizer_load(argv[3], err, sizeof err);
        if (!t) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        for (int i = 5; i < argc; i++)
            run(t, argv[4], text, (size_t)n, strtoul(argv[i], NULL, 10));
        kvg_tokenizer_free(t);
        free(text);
        return 0;
    }
    fprintf(stderr, "usage: %s gen OUT [BYTES] | run TEXT TOKENIZER LABEL CHUNK...\n", argv[0]);
    return 2;
}
