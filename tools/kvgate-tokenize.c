/* kvgate-tokenize: encode stdin to token ids, or decode ids back to text.
 *
 *   kvgate-tokenize --tokenizer FILE [--bos] [--special] < text   -> "id id id\n"
 *   kvgate-tokenize --tokenizer FILE --decode < ids               -> the text
 *
 * FILE is a llama2.c tokenizer.bin, a GGUF file or a tokenizer.json (detected
 * from its contents). Exit status: 0 ok, 1 bad tokenizer file or input, 2 usage. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static const char USAGE[] =
    "usage: kvgate-tokenize --tokenizer FILE [--bos] [--special] [--decode]\n"
    "\n"
    "Reads all of standard input. By default encodes it as one text and prints the\n"
    "token ids on one line, separated by spaces. With --decode, reads whitespace-\n"
    "separated token ids and prints the text they decode to.\n"
    "\n"
    "  --tokenizer FILE  llama2.c tokenizer.bin, GGUF, or Hugging Face tokenizer.json\n"
    "  --bos             prepend the BOS token (when the vocabulary has one)\n"
    "  --special         recognise special-token text such as <|im_start|> in the input\n"
    "  --lines           encode many texts, the vocabulary loaded once: each input line\n"
    "                    is one JSON string; prints one line of ids per input line\n"
    "  --decode          decode ids instead of encoding text\n"
    "  --help            show this help\n";

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (!buf || ferror(f)) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int encode(kvg_tokenizer *t, const char *in, size_t len, unsigned flags)
{
    int32_t *ids;
    size_t n;
    char err[512];

    if (kvg_tokenizer_encode(t, in, len, flags, &ids, &n, err, sizeof err) < 0) {
        fprintf(stderr, "kvgate-tokenize: cannot encode the input: %s\n", err);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    free(ids);
    return 0;
}

/* --lines (a reference comparison over a corpus: t/tokenizer-hf.t): in holds JSON
 * Lines, each one JSON string, so that a text may hold anything (newlines, NUL)
 * written with JSON escapes. A last line without its newline counts; a blank line is
 * an error, not an empty text ("" is the empty text). */
static int encode_lines(kvg_tokenizer *t, char *in, size_t len, unsigned flags)
{
    size_t line = 0;
    for (char *p = in; p < in + len; line++) {
        char *nl = memchr(p, '\n', (size_t)(in + len - p));
        char *end = nl ? nl : in + len;
        json_error_t jerr;
        json_t *s = json_loadb(p, (size_t)(end - p), JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        if (!json_is_string(s)) {
            fprintf(stderr, "kvgate-tokenize: --lines input line %zu is not a JSON string%s%s\n", line + 1,
                    s ? "" : ": ", s ? "" : jerr.text);
            json_decref(s);
            return 1;
        }
        int rc = encode(t, json_string_value(s), json_string_length(s), flags);
        json_decref(s);
        if (rc != 0) {
            fprintf(stderr, "kvgate-tokenize: (--lines input line %zu)\n", line + 1);
            return rc;
        }
        p = nl ? nl + 1 : end;
    }
    return 0;
}

static int decode(kvg_tokenizer *t, char *in)
{
    size_t n = 0, cap = 1024;
    int32_t *ids = malloc(cap * sizeof *ids);
    char *p = in, err[512];

    while (ids) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX
            || (*end && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r' && *end != ',')) {
            size_t w = strcspn(p, " \t\r\n,");
            fprintf(stderr, "kvgate-tokenize: --decode input has '%.*s' at byte offset %zu, not a token id\n",
                    (int)(w > 20 ? 20 : w), p, (size_t)(p - in));
            free(ids);
            return 1;
        }
        if (n == cap) {
            int32_t *nv = realloc(ids, cap * 2 * sizeof *ids);
            if (!nv)
                break;
            ids = nv;
            cap *= 2;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (!ids) {
        fprintf(stderr, "kvgate-tokenize: out of memory\n");
        return 1;
    }
    char *text;
    size_t len;
    if (kvg_tokenizer_decode(t, ids, n, &text, &len, err, sizeof err) < 0) {
        fprintf(stderr, "kvgate-tokenize: cannot decode: %s\n", err);
        free(ids);
        return 1;
    }
    fwrite(text, 1, len, stdout);
    free(text);
    free(ids);
    return 0;
}

int main(int argc, char **argv)
{
    int lines = 0;
    const char *path = NULL;
    unsigned flags = 0;
    int do_decode = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(USAGE, stdout);
            return 0;
        } else if (strcmp(a, "--tokenizer") == 0 && i + 1 < argc) {
            path = argv[++i];
        } else if (strncmp(a, "--tokenizer=", 12) == 0) {
            path = a + 12;
        } else if (strcmp(a, "--bos") == 0) {
            flags |= KVG_ENC_BOS;
        } else if (strcmp(a, "--lines") == 0) {
            lines = 1;
        } else if (strcmp(a, "--special") == 0) {
            flags |= KVG_ENC_PARSE_SPECIAL;
        } else if (strcmp(a, "--decode") == 0) {
            do_decode = 1;
        } else {
            fprintf(stderr, "kvgate-tokenize: unknown or incomplete option '%s'\n%s", a, USAGE);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "kvgate-tokenize: --tokenizer FILE is required\n%s", USAGE);
        return 2;
    }
    if (do_decode && lines) {
        fprintf(stderr, "kvgate-tokenize: --lines encodes; it does not go with --decode\n%s", USAGE);
        return 2;
    }

    char err[512];
    kvg_tokenizer *t = kvg_tokenizer_load(path, err, sizeof err);
    if (!t) {
        fprintf(stderr, "kvgate-tokenize: %s\n", err);
        return 1;
    }
    size_t len;
    char *in = read_all(stdin, &len);
    if (!in) {
        fprintf(stderr, "kvgate-tokenize: cannot read standard input: %s\n", strerror(errno));
        kvg_tokenizer_free(t);
        return 1;
    }
    int rc = do_decode ? decode(t, in) : lines ? encode_lines(t, in, len, flags) : encode(t, in, len, flags);
    free(in);
    kvg_tokenizer_free(t);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "kvgate-tokenize: cannot write the output: %s\n", strerror(errno));
        return 1;
    }
    return rc;
}
