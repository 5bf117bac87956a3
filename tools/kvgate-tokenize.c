/* kvgate-tokenize: encode stdin to token ids, or decode ids back to text, or
 * render a chat request with a model's chat template.
 *
 *   kvgate-tokenize --tokenizer FILE [--bos] [--special] < text   -> "id id id\n"
 *   kvgate-tokenize --tokenizer FILE --decode < ids               -> the text
 *   kvgate-tokenize --chat MESSAGES.json (--template T.jinja | --tokenizer M) [--text] ...
 *                                                                 -> the prompt's ids,
 *                                                                    or its text
 *   kvgate-tokenize --chat-batch JOBS.json                        -> a JSON array of
 *                                                                    --chat results
 *
 * FILE is a llama2.c tokenizer.bin, a GGUF file or a tokenizer.json (detected
 * from its contents). Exit status: 0 ok, 1 bad tokenizer file or input (or a
 * template that raised), 2 usage. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "chat_source.h"
#include "chat_vars.h"
#include "jinja.h"
#include "tokenizer.h"

static const char USAGE[] =
    "usage: kvgate-tokenize --tokenizer FILE [--bos] [--special] [--decode]\n"
    "       kvgate-tokenize --chat MESSAGES.json (--template FILE.jinja | --tokenizer MODEL)\n"
    "                       [--tools TOOLS.json] [--template-kwargs JSON] [--add-generation-prompt]\n"
    "                       [--bos-token TEXT] [--eos-token TEXT] [--text]\n"
    "       kvgate-tokenize --chat-batch JOBS.json\n"
    "\n"
    "Reads all of standard input. By default encodes it as one text and prints the\n"
    "token ids on one line, separated by spaces. With --decode, reads whitespace-\n"
    "separated token ids and prints the text they decode to.\n"
    "\n"
    "  --tokenizer FILE  llama2.c tokenizer.bin, GGUF, or Hugging Face tokenizer.json\n"
    "                    (with --chat also a model directory holding tokenizer.json)\n"
    "  --bos             prepend the BOS token (when the vocabulary has one)\n"
    "  --special         recognise special-token text such as <|im_start|> in the input\n"
    "  --lines           encode many texts, the vocabulary loaded once: each input line\n"
    "                    is one JSON string; prints one line of ids per input line\n"
    "  --decode          decode ids instead of encoding text\n"
    "  --help            show this help\n"
    "\n"
    "With --chat, renders a chat request with a chat template instead, as the engine\n"
    "does, and prints the token ids the engine would see (the whole prompt encoded\n"
    "with special tokens parsed outside message data; no BOS added: the template\n"
    "renders it), or with --text the rendered prompt itself, byte for byte.\n"
    "\n"
    "  --chat FILE       the request's messages: a JSON array, or an object with\n"
    "                    \"messages\" and optionally \"tools\" and \"chat_template_kwargs\"\n"
    "  --template FILE   the Jinja template (default: the one --tokenizer's model ships:\n"
    "                    GGUF tokenizer.chat_template, chat_template.jinja or\n"
    "                    tokenizer_config.json beside a tokenizer.json)\n"
    "  --tools FILE      the request's tools (a JSON array); replaces the file's\n"
    "  --template-kwargs JSON  chat_template_kwargs (an object); replaces the file's\n"
    "  --add-generation-prompt  end with the assistant turn's header\n"
    "  --bos-token TEXT, --eos-token TEXT  the template's bos_token and eos_token\n"
    "                    (default: the model's, else \"\")\n"
    "  --text            print the rendered text instead of token ids\n"
    "\n"
    "  --chat-batch FILE many --chat runs in one process: FILE is a JSON array whose\n"
    "                    elements are the arguments of one run each (arrays of strings,\n"
    "                    --chat and its options); prints a JSON array with one object\n"
    "                    per run: {\"rc\": exit status, \"out\": what it printed, \"err\":\n"
    "                    its error message}. Exit status 0 when every run could be made.\n"
    "\n"
    "KVGATE_TEMPLATE_NOW=SECONDS fixes the clock strftime_now reads (tests).\n";

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

/* ---- --chat: render a request with a chat template ---- */

typedef struct chat_opts {
    const char *chat, *template_path, *tools, *kwargs, *bos, *eos;
    int add_generation_prompt, text;
} chat_opts;

static json_t *load_json(const char *path, const char *what, FILE *errf)
{
    json_error_t je;
    json_t *v = json_load_file(path, JSON_DECODE_ANY, &je);

    if (!v)
        fprintf(errf, "kvgate-tokenize: %s %s:%d:%d: %s\n", what, path, je.line, je.column, je.text);
    return v;
}

/* The request's variables: messages (and tools, chat_template_kwargs) from the
 * --chat file, --tools and --template-kwargs replacing the file's. */
static json_t *request_data(const chat_opts *o, FILE *errf)
{
    json_t *file = load_json(o->chat, "--chat", errf), *tools = NULL, *kwargs = NULL, *data = NULL;
    const json_t *messages = file, *ftools = NULL, *fkwargs = NULL;
    char err[512], param[128];
    json_error_t je;

    if (!file)
        return NULL;
    if (json_is_object(file)) {
        messages = json_object_get(file, "messages");
        ftools = json_object_get(file, "tools");
        fkwargs = json_object_get(file, "chat_template_kwargs");
    }
    if (o->tools && !(tools = load_json(o->tools, "--tools", errf)))
        goto done;
    if (o->kwargs && !(kwargs = json_loads(o->kwargs, JSON_DECODE_ANY, &je))) {
        fprintf(errf, "kvgate-tokenize: --template-kwargs: %s at character %d\n", je.text, je.position);
        goto done;
    }
    if (kvg_chat_vars_build(messages, tools ? tools : ftools, kwargs ? kwargs : fkwargs, &data,
                            err, sizeof err, param, sizeof param) != KVG_CHAT_VARS_OK)
        fprintf(errf, "kvgate-tokenize: %s: %s\n", o->chat, err);
done:
    json_decref(tools);
    json_decref(kwargs);
    json_decref(file);
    return data;
}

static char *slurp_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *s;

    if (!f)
        return NULL;
    s = read_all(f, len);
    fclose(f);
    return s;
}

/* The template's bos_token / eos_token when not given: what the model's files
 * say (tokenizer_config.json, GGUF metadata: what the reference renders with),
 * "" when they say nothing; without such files (a tokenizer.bin) the
 * vocabulary's text of its BOS/EOS token, else "". */
static const char *special_default(const char *given, const kvg_chat_source *src, const char *from_files,
                                   const kvg_tokenizer *t, int32_t id, char *buf, size_t cap)
{
    const unsigned char *b;
    size_t n;

    if (given)
        return given;
    if (src)
        return from_files ? from_files : "";
    if (t && id >= 0 && (b = kvg_tokenizer_token_bytes(t, id, &n)) && n < cap) {
        memcpy(buf, b, n);
        buf[n] = '\0';
        return buf;
    }
    return "";
}

static int print_ids(const kvg_tokenizer *t, const kvg_jinja_output *out, FILE *outf, FILE *errf)
{
    int32_t *ids;
    size_t n;
    char err[512];

    if (kvg_tokenizer_encode_spans(t, out->text, out->len, KVG_ENC_PARSE_SPECIAL, out->spans,
                                   out->n_spans, &ids, &n, err, sizeof err) < 0) {
        fprintf(errf, "kvgate-tokenize: cannot encode the rendered prompt: %s\n", err);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        fprintf(outf, i ? " %d" : "%d", ids[i]);
    fputc('\n', outf);
    free(ids);
    return 0;
}

/* One --chat run: what it prints goes to outf, its errors to errf. */
static int chat(const chat_opts *o, const char *tok_path, FILE *outf, FILE *errf)
{
    kvg_chat_source src = { 0 };
    kvg_tokenizer *t = NULL;
    kvg_jinja *tpl = NULL;
    kvg_jinja_output out = { 0 };
    kvg_jinja_limits lim = { 0 };
    json_t *data = NULL, *trusted = NULL;
    char err[1024], bos_buf[256], eos_buf[256], dir_tok[4096], *tpl_text = NULL;
    const char *tpl_name, *env = getenv("KVGATE_TEMPLATE_NOW");
    size_t tpl_len = 0;
    int have_src = 0, rc = 1, jrc;

    if (tok_path) {
        /* the model's template and BOS/EOS; with --template, only the latter
         * are wanted, and a vocabulary without them (tokenizer.bin) is fine */
        have_src = kvg_chat_source_load(tok_path, &src, err, sizeof err) == 0;
        if (!have_src && !o->template_path) {
            fprintf(errf, "kvgate-tokenize: %s\n", err);
            return 1;
        }
        /* the vocabulary is for the ids, or for BOS/EOS texts no file gave; a
         * model directory's is its tokenizer.json */
        struct stat st;
        if (!have_src && stat(tok_path, &st) == 0 && S_ISDIR(st.st_mode)) {
            snprintf(dir_tok, sizeof dir_tok, "%s/tokenizer.json", tok_path);
            tok_path = dir_tok;
        }
        if ((!o->text || (!have_src && (!o->bos || !o->eos)))
            && !(t = kvg_tokenizer_load(have_src ? src.tokenizer_path : tok_path, err, sizeof err))) {
            fprintf(errf, "kvgate-tokenize: %s\n", err);
            goto done;
        }
    }
    if (o->template_path) {
        if (!(tpl_text = slurp_file(o->template_path, &tpl_len))) {
            fprintf(errf, "kvgate-tokenize: %s: cannot read: %s\n", o->template_path, strerror(errno));
            goto done;
        }
        tpl_name = o->template_path;
    } else {
        tpl_text = src.template_src;
        tpl_len = src.template_len;
        src.template_src = NULL;
        tpl_name = src.where;
    }
    if (!(data = request_data(o, errf)))
        goto done;
    trusted = json_pack("{s:s, s:s, s:b}",
                        "bos_token", special_default(o->bos, have_src ? &src : NULL, src.bos_token, t,
                                                     t ? kvg_tokenizer_bos(t) : -1, bos_buf, sizeof bos_buf),
                        "eos_token", special_default(o->eos, have_src ? &src : NULL, src.eos_token, t,
                                                     t ? kvg_tokenizer_eos(t) : -1, eos_buf, sizeof eos_buf),
                        "add_generation_prompt", o->add_generation_prompt);
    if (!trusted) {
        fprintf(errf, "kvgate-tokenize: out of memory (or a --bos-token/--eos-token not UTF-8)\n");
        goto done;
    }
    if (!(tpl = kvg_jinja_compile(tpl_text, tpl_len, tpl_name, err, sizeof err))) {
        fprintf(errf, "kvgate-tokenize: %s\n", err);
        goto done;
    }
    if (env && *env)
        lim.now = (time_t)strtoll(env, NULL, 10);
    if ((jrc = kvg_jinja_render(tpl, trusted, data, &lim, &out, err, sizeof err)) != KVG_JINJA_OK) {
        if (jrc == KVG_JINJA_ERROR)     /* err names the template and line itself */
            fprintf(errf, "kvgate-tokenize: %s\n", err);
        else
            fprintf(errf, "kvgate-tokenize: %s: %s%s\n", tpl_name,
                    jrc == KVG_JINJA_RAISED ? "the template raised an exception: " : "", err);
        goto done;
    }
    if (o->text) {
        fwrite(out.text, 1, out.len, outf);
        rc = 0;
    } else {
        rc = print_ids(t, &out, outf, errf);
    }
done:
    if (out.text)
        kvg_jinja_output_free(&out);
    if (tpl)
        kvg_jinja_free(tpl);
    json_decref(trusted);
    json_decref(data);
    if (tpl_text != src.template_src)
        free(tpl_text);
    kvg_chat_source_free(&src);
    if (t)
        kvg_tokenizer_free(t);
    return rc;
}

/* ---- the command line ---- */

typedef struct cli_opts {
    const char *path;            /* --tokenizer */
    const char *batch;           /* --chat-batch */
    unsigned flags;              /* KVG_ENC_* */
    int lines, do_decode, help;
    chat_opts co;
} cli_opts;

/* Parses argv[first..argc-1] into *o: 0, or 2 with the complaint on errf. */
static int parse_args(int argc, char **argv, int first, cli_opts *o, FILE *errf)
{
    memset(o, 0, sizeof *o);
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            o->help = 1;
        } else if (strcmp(a, "--tokenizer") == 0 && i + 1 < argc) {
            o->path = argv[++i];
        } else if (strncmp(a, "--tokenizer=", 12) == 0) {
            o->path = a + 12;
        } else if (strcmp(a, "--bos") == 0) {
            o->flags |= KVG_ENC_BOS;
        } else if (strcmp(a, "--lines") == 0) {
            o->lines = 1;
        } else if (strcmp(a, "--special") == 0) {
            o->flags |= KVG_ENC_PARSE_SPECIAL;
        } else if (strcmp(a, "--decode") == 0) {
            o->do_decode = 1;
        } else if (strcmp(a, "--chat") == 0 && i + 1 < argc) {
            o->co.chat = argv[++i];
        } else if (strcmp(a, "--chat-batch") == 0 && i + 1 < argc) {
            o->batch = argv[++i];
        } else if (strcmp(a, "--template") == 0 && i + 1 < argc) {
            o->co.template_path = argv[++i];
        } else if (strcmp(a, "--tools") == 0 && i + 1 < argc) {
            o->co.tools = argv[++i];
        } else if (strcmp(a, "--template-kwargs") == 0 && i + 1 < argc) {
            o->co.kwargs = argv[++i];
        } else if (strcmp(a, "--bos-token") == 0 && i + 1 < argc) {
            o->co.bos = argv[++i];
        } else if (strcmp(a, "--eos-token") == 0 && i + 1 < argc) {
            o->co.eos = argv[++i];
        } else if (strcmp(a, "--add-generation-prompt") == 0) {
            o->co.add_generation_prompt = 1;
        } else if (strcmp(a, "--text") == 0) {
            o->co.text = 1;
        } else {
            fprintf(errf, "kvgate-tokenize: unknown or incomplete option '%s'\n", a);
            return 2;
        }
    }
    return 0;
}

static int wants_chat(const cli_opts *o)
{
    const chat_opts *c = &o->co;
    return c->chat || c->template_path || c->tools || c->kwargs || c->bos || c->eos
        || c->add_generation_prompt || c->text;
}

/* What is wrong with a --chat command line, or NULL. */
static const char *chat_usage_error(const cli_opts *o)
{
    return !o->co.chat ? "the chat options need --chat MESSAGES.json"
        : !o->co.template_path && !o->path ? "--chat needs --template FILE or --tokenizer MODEL"
        : !o->co.text && !o->path ? "token ids need --tokenizer (or print the prompt with --text)"
        : o->flags || o->do_decode || o->lines ? "--bos, --special, --lines and --decode do not apply to --chat"
        : o->batch || o->help ? "--chat-batch and --help do not go with --chat"
        : NULL;
}

/* One job of --chat-batch: its arguments as a command line, run as one would be,
 * with what it prints and its errors captured. The result object, or NULL when
 * memory ran out. */
static json_t *batch_job(const json_t *args)
{
    size_t n = json_array_size(args), i;
    char **argv = calloc(n + 1, sizeof *argv), *out = NULL, *err = NULL;
    size_t out_len = 0, err_len = 0;
    FILE *outf = open_memstream(&out, &out_len), *errf = open_memstream(&err, &err_len);
    json_t *res = NULL, *out_s = NULL;
    cli_opts o;
    int rc = 2;

    if (!argv || !outf || !errf)
        goto done;
    for (i = 0; i < n; i++) {
        if (!(argv[i] = (char *)json_string_value(json_array_get(args, i)))) {
            fprintf(errf, "kvgate-tokenize: --chat-batch: argument %zu is not a string\n", i + 1);
            break;
        }
    }
    if (i == n && parse_args((int)n, argv, 0, &o, errf) == 0) {
        const char *bad = chat_usage_error(&o);
        if (bad)
            fprintf(errf, "kvgate-tokenize: %s\n", bad);
        else
            rc = chat(&o.co, o.path, outf, errf);
    }
    fclose(outf);
    fclose(errf);
    outf = errf = NULL;
    /* a rendering is UTF-8 (the templates' strings are); one that is not cannot be
     * a JSON string and is reported as such */
    if (!(out_s = json_stringn(out ? out : "", out_len))) {
        rc = rc ? rc : 1;
        out_s = json_string("");
    }
    if (out_s) {
        res = json_pack("{s:i, s:O, s:s%}", "rc", rc, "out", out_s, "err", err ? err : "", err_len);
        if (!res)        /* an error message that is not UTF-8 (a file name, say) */
            res = json_pack("{s:i, s:O, s:s}", "rc", rc ? rc : 1, "out", out_s, "err",
                            "kvgate-tokenize: (an error message that is not UTF-8)");
        json_decref(out_s);
    }
done:
    if (outf)
        fclose(outf);
    if (errf)
        fclose(errf);
    free(out);
    free(err);
    free(argv);
    return res;
}

/* --chat-batch FILE: every job of FILE, the results as one JSON array on stdout. */
static int chat_batch(const char *path)
{
    json_error_t je;
    json_t *jobs = json_load_file(path, 0, &je), *results = NULL;
    size_t i;
    json_t *job;
    int rc = 1;

    if (!jobs) {
        fprintf(stderr, "kvgate-tokenize: --chat-batch %s:%d:%d: %s\n", path, je.line, je.column, je.text);
        return 1;
    }
    if (!json_is_array(jobs)) {
        fprintf(stderr, "kvgate-tokenize: --chat-batch %s: not a JSON array of jobs\n", path);
        goto done;
    }
    if (!(results = json_array()))
        goto oom;
    json_array_foreach(jobs, i, job) {
        if (!json_is_array(job)) {
            fprintf(stderr, "kvgate-tokenize: --chat-batch %s: job %zu is not an array of arguments\n", path,
                    i + 1);
            goto done;
        }
        json_t *r = batch_job(job);
        if (!r || json_array_append_new(results, r) != 0)
            goto oom;
    }
    if (json_dumpf(results, stdout, JSON_COMPACT) != 0 || fputc('\n', stdout) == EOF) {
        fprintf(stderr, "kvgate-tokenize: cannot write the output: %s\n", strerror(errno));
        goto done;
    }
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "kvgate-tokenize: out of memory\n");
done:
    json_decref(results);
    json_decref(jobs);
    return rc;
}

int main(int argc, char **argv)
{
    cli_opts o;

    if (parse_args(argc, argv, 1, &o, stderr) != 0) {
        fputs(USAGE, stderr);
        return 2;
    }
    if (o.help) {
        fputs(USAGE, stdout);
        return 0;
    }
    if (o.batch) {
        if (argc != 3) {
            fprintf(stderr, "kvgate-tokenize: --chat-batch takes its options from its file\n%s", USAGE);
            return 2;
        }
        return chat_batch(o.batch);
    }
    if (wants_chat(&o)) {
        const char *bad = chat_usage_error(&o);
        if (bad) {
            fprintf(stderr, "kvgate-tokenize: %s\n%s", bad, USAGE);
            return 2;
        }
        int rc = chat(&o.co, o.path, stdout, stderr);
        if (fflush(stdout) != 0) {
            fprintf(stderr, "kvgate-tokenize: cannot write the output: %s\n", strerror(errno));
            return 1;
        }
        return rc;
    }
    if (!o.path) {
        fprintf(stderr, "kvgate-tokenize: --tokenizer FILE is required\n%s", USAGE);
        return 2;
    }
    if (o.do_decode && o.lines) {
        fprintf(stderr, "kvgate-tokenize: --lines encodes; it does not go with --decode\n%s", USAGE);
        return 2;
    }

    char err[512];
    kvg_tokenizer *t = kvg_tokenizer_load(o.path, err, sizeof err);
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
    int rc = o.do_decode ? decode(t, in) : o.lines ? encode_lines(t, in, len, o.flags) : encode(t, in, len, o.flags);
    free(in);
    kvg_tokenizer_free(t);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "kvgate-tokenize: cannot write the output: %s\n", strerror(errno));
        return 1;
    }
    return rc;
}
