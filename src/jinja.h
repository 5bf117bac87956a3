/* Jinja chat templates: compile a model's own template once, render it per
 * request, with the semantics of Hugging Face transformers' apply_chat_template
 * (Jinja2 in an ImmutableSandboxedEnvironment, trim_blocks and lstrip_blocks on,
 * the loopcontrols extension, a {% generation %} block that renders its body,
 * globals raise_exception(msg) and strftime_now(fmt), filter tojson as
 * json.dumps(x, ensure_ascii=False, indent=, separators=, sort_keys=)).
 * ../shared/templates/README.md states the reference exactly.
 *
 * Variables come as two JSON objects (jansson):
 *   trusted  bos_token, eos_token, add_generation_prompt, ...: strings from here
 *            are template text (their special tokens are parsed)
 *   data     messages, tools, chat_template_kwargs' keys, ...: every string that
 *            comes from here is DATA, and so is every byte of output derived from
 *            one (through filters, slicing, concatenation, tojson, ...)
 * A name in both is taken from trusted.
 *
 * The output is one string plus the spans of it that are data, so that the
 * caller can tokenize the whole prompt as the reference does while never
 * parsing special-token text inside data (a user who types "<|im_start|>system"
 * does not forge a turn): see kvg_tokenizer_encode_spans() in tokenizer.h.
 *
 * A compiled template is immutable: any number of threads may render it at once.
 * A render uses at most about 512 KiB of C stack below its caller's frame (deeper
 * recursion stops with KVG_JINJA_LIMIT), so a thread needs a stack a little larger.
 * A model file is input too: compiling refuses what it does not understand with
 * "NAME:LINE:COL: message", and rendering is bounded by kvg_jinja_limits. */
#ifndef KVG_JINJA_H
#define KVG_JINJA_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <jansson.h>

#include "text_span.h"

typedef struct kvg_jinja kvg_jinja;

typedef struct kvg_jinja_output {
    char *text;                  /* malloc'd, NUL-terminated (len excludes the NUL) */
    size_t len;
    kvg_text_span *spans;        /* the runs of output bytes that came from data: sorted,
                                    not overlapping, maximal (two never touch);
                                    malloc'd, NULL when n_spans == 0 */
    size_t n_spans;
} kvg_jinja_output;

typedef struct kvg_jinja_limits {
    size_t max_output;           /* bytes of output; 0: KVG_JINJA_DEFAULT_MAX_OUTPUT */
    uint64_t max_steps;          /* loop iterations + macro/filter calls; 0: default */
    unsigned max_depth;          /* nesting of macro calls, includes of blocks,
                                    expression recursion; 0: default */
    time_t now;                  /* strftime_now's clock (UTC is not assumed: local
                                    time as Python's datetime.now()); 0: time(NULL) */
} kvg_jinja_limits;

#define KVG_JINJA_DEFAULT_MAX_OUTPUT  (64u << 20)
#define KVG_JINJA_DEFAULT_MAX_STEPS   10000000u
#define KVG_JINJA_DEFAULT_MAX_DEPTH   128u

/* Results of kvg_jinja_render. */
enum {
    KVG_JINJA_OK = 0,
    KVG_JINJA_RAISED = 1,        /* the template called raise_exception(msg): err is msg */
    KVG_JINJA_ERROR = 2,         /* what Jinja2 raises at render time (a type error, an
                                    undefined attribute of an undefined value, a sandbox
                                    refusal, ...): err names the template line */
    KVG_JINJA_LIMIT = 3,         /* a kvg_jinja_limits bound was reached: err says which */
    KVG_JINJA_NOMEM = 4
};

/* Compiles src[0..len) (UTF-8). name is used in messages ("model.gguf
 * tokenizer.chat_template"). NULL with err "NAME:LINE:COL: what" when the
 * template does not parse, or uses a construct, filter, test or method this
 * engine lacks (a template that would fail at render time for that reason fails
 * here instead). */
kvg_jinja *kvg_jinja_compile(const char *src, size_t len, const char *name,
                             char *err, size_t err_len);
void kvg_jinja_free(kvg_jinja *t);

/* Renders t. trusted and data are JSON objects (either may be NULL); lim may be
 * NULL for the defaults. On KVG_JINJA_OK *out is filled (kvg_jinja_output_free);
 * otherwise *out is empty and err says why. */
int kvg_jinja_render(const kvg_jinja *t, const json_t *trusted, const json_t *data,
                     const kvg_jinja_limits *lim, kvg_jinja_output *out,
                     char *err, size_t err_len);
void kvg_jinja_output_free(kvg_jinja_output *out);

#endif
