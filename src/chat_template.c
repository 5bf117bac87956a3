#include "chat_template.h"
#include "chat_template_testing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

static const char *const TPL_NAMES[KVG_TPL_COUNT] = { "plain", "llama2", "chatml", "llama3" };

int kvg_chat_template_from_name(const char *name, kvg_chat_template *out,
                                char *err, size_t err_len)
{
    for (int i = 0; name && i < KVG_TPL_COUNT; i++) {
        if (strcmp(name, TPL_NAMES[i]) == 0) {
            *out = (kvg_chat_template)i;
            return 0;
        }
    }
    snprintf(err, err_len, "unknown chat template '%.64s' (expected plain, llama2, chatml or llama3)",
             name ? name : "(null)");
    return -1;
}

const char *kvg_chat_template_name(kvg_chat_template t)
{
    return (unsigned)t < KVG_TPL_COUNT ? TPL_NAMES[t] : "unknown";
}

static int contains(const char *s, size_t n, const char *needle)
{
    return memmem(s, n, needle, strlen(needle)) != NULL;
}

kvg_chat_template kvg_chat_template_detect(const char *jinja, size_t len)
{
    if (!jinja || len == 0)
        return KVG_TPL_PLAIN;
    /* Llama-3 first: its header markers are unambiguous, while "[INST]" or
     * "<|im_start|>" could appear in a template's comments or examples. */
    if (contains(jinja, len, "<|start_header_id|>"))
        return KVG_TPL_LLAMA3;
    if (contains(jinja, len, "<|im_start|>"))
        return KVG_TPL_CHATML;
    if (contains(jinja, len, "[INST]"))
        return KVG_TPL_LLAMA2;
    return KVG_TPL_PLAIN;
}

int kvg_chat_template_has_bos(kvg_chat_template t)
{
    return t == KVG_TPL_LLAMA2 || t == KVG_TPL_LLAMA3;
}

static const char *const STOP_LLAMA2[] = { "</s>" };
static const char *const STOP_CHATML[] = { "<|im_end|>", "<|endoftext|>" };
static const char *const STOP_LLAMA3[] = { "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>" };
static const char *const STOPSTR_PLAIN[] = { "\nUser:" };

const char *const *kvg_chat_template_stop_pieces(kvg_chat_template t, size_t *n)
{
    switch (t) {
    case KVG_TPL_LLAMA2:
        *n = 1;
        return STOP_LLAMA2;
    case KVG_TPL_CHATML:
        *n = 2;
        return STOP_CHATML;
    case KVG_TPL_LLAMA3:
        *n = 3;
        return STOP_LLAMA3;
    default:
        *n = 0;
        return NULL;
    }
}

const char *const *kvg_chat_template_stop_strings(kvg_chat_template t, size_t *n)
{
    if (t == KVG_TPL_PLAIN) {
        *n = 1;
        return STOPSTR_PLAIN;
    }
    *n = 0;
    return NULL;
}

size_t kvg_chat_max_segments(size_t n_messages)
{
    /* llama2's worst message is BOS, "[INST] ", content, " [/INST]" (4) and its
     * system prefix adds 2; others need 3 per message; +2 for BOS and the
     * generation prompt. */
    return 5 * n_messages + 2;
}

/* Python's str.isspace() set, which Jinja's trim and str.strip() use. */
static int is_py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0
        || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029
        || c == 0x202F || c == 0x205F || c == 0x3000;
}

static void rstrip(const char *s, size_t *len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = *len;

    while (n > 0) {
        size_t start = n - 1;
        uint32_t cp;
        /* back up over continuation bytes to the start of the last character */
        while (start > 0 && n - start < 4 && (p[start] & 0xC0) == 0x80)
            start--;
        if (kvg_utf8_decode(p + start, n - start, &cp) != (int)(n - start) || !is_py_space(cp))
            break;
        n = start;
    }
    *len = n;
}

static void strip(const char **s, size_t *len)
{
    const unsigned char *p = (const unsigned char *)*s;
    size_t i = 0;
    uint32_t cp;
    int l;

    while (i < *len && (l = kvg_utf8_decode(p + i, *len - i, &cp)) > 0 && is_py_space(cp))
        i += (size_t)l;
    *s += i;
    *len -= i;
    rstrip(*s, len);
}

typedef struct {
    kvg_chat_segment *segs;
    size_t cap, n;
    int overflow;
} segbuf;

/* Empty segments are dropped so the worker never encodes nothing. */
static void add(segbuf *b, kvg_seg_kind kind, const char *text, size_t len)
{
    if (len == 0 && (kind == KVG_SEG_TEMPLATE || kind == KVG_SEG_CONTENT))
        return;
    if (b->n == b->cap) {
        b->overflow = 1;
        return;
    }
    b->segs[b->n].kind = kind;
    b->segs[b->n].text = text;
    b->segs[b->n].len = len;
    b->n++;
}

static void add_lit(segbuf *b, kvg_seg_kind kind, const char *lit)
{
    add(b, kind, lit, strlen(lit));
}

static const char *const ROLE_NAMES[] = { "system", "user", "assistant" };

static int valid_role(kvg_chat_role r)
{
    return (unsigned)r <= KVG_ROLE_ASSISTANT;
}

static int render_llama2(const kvg_chat_message *m, size_t n, segbuf *b, char *err, size_t err_len)
{
    const kvg_chat_message *sys = NULL;

    if (m[0].role == KVG_ROLE_SYSTEM) {
        sys = &m[0];
        m++;
        n--;
    }
    if (n == 0) {
        snprintf(err, err_len, "the llama2 chat template needs a user message after the system message");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const char *c = m[i].content;
        size_t len = m[i].content_len;
        kvg_chat_role want = i % 2 == 0 ? KVG_ROLE_USER : KVG_ROLE_ASSISTANT;

        if (m[i].role != want) {
            snprintf(err, err_len, "the llama2 chat template needs roles alternating user/assistant/"
                     "user/... after an optional first system message; message %zu is '%s'",
                     i + (sys ? 1 : 0), ROLE_NAMES[m[i].role]);
            return -1;
        }
        if (want == KVG_ROLE_USER) {
            add_lit(b, KVG_SEG_BOS, "<s>");
            if (i == 0 && sys) {
                /* The reference strips "<<SYS>>..." + user as one string, so a
                 * system block keeps the user text's leading spaces, and an
                 * all-space user text lets the strip eat the block's "\n\n". */
                add_lit(b, KVG_SEG_TEMPLATE, "[INST] <<SYS>>\n");
                add(b, KVG_SEG_CONTENT, sys->content, sys->content_len);
                rstrip(c, &len);
                add_lit(b, KVG_SEG_TEMPLATE, len ? "\n<</SYS>>\n\n" : "\n<</SYS>>");
            } else {
                add_lit(b, KVG_SEG_TEMPLATE, "[INST] ");
                strip(&c, &len);
            }
            add(b, KVG_SEG_CONTENT, c, len);
            add_lit(b, KVG_SEG_TEMPLATE, " [/INST]");
        } else {
            strip(&c, &len);
            add_lit(b, KVG_SEG_TEMPLATE, " ");
            add(b, KVG_SEG_CONTENT, c, len);
            add_lit(b, KVG_SEG_TEMPLATE, " ");
            add_lit(b, KVG_SEG_EOS, "</s>");
        }
    }
    return 0;
}

static void render_chatml(const kvg_chat_message *m, size_t n, int gen, segbuf *b)
{
    static const char *const HEAD[] = { "<|im_start|>system\n", "<|im_start|>user\n",
                                        "<|im_start|>assistant\n" };
    for (size_t i = 0; i < n; i++) {
        add_lit(b, KVG_SEG_TEMPLATE, HEAD[m[i].role]);
        add(b, KVG_SEG_CONTENT, m[i].content, m[i].content_len);
        add_lit(b, KVG_SEG_TEMPLATE, "<|im_end|>\n");
    }
    if (gen)
        add_lit(b, KVG_SEG_TEMPLATE, HEAD[KVG_ROLE_ASSISTANT]);
}

static void render_llama3(const kvg_chat_message *m, size_t n, int gen, segbuf *b)
{
    static const char *const HEAD[] = {
        "<|start_header_id|>system<|end_header_id|>\n\n",
        "<|start_header_id|>user<|end_header_id|>\n\n",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    };
    add_lit(b, KVG_SEG_BOS, "<|begin_of_text|>");
    for (size_t i = 0; i < n; i++) {
        const char *c = m[i].content;
        size_t len = m[i].content_len;

        strip(&c, &len);
        add_lit(b, KVG_SEG_TEMPLATE, HEAD[m[i].role]);
        add(b, KVG_SEG_CONTENT, c, len);
        add_lit(b, KVG_SEG_TEMPLATE, "<|eot_id|>");
    }
    if (gen)
        add_lit(b, KVG_SEG_TEMPLATE, HEAD[KVG_ROLE_ASSISTANT]);
}

static void render_plain(const kvg_chat_message *m, size_t n, int gen, segbuf *b)
{
    static const char *const HEAD[] = { "System: ", "User: ", "Assistant: " };

    for (size_t i = 0; i < n; i++) {
        add_lit(b, KVG_SEG_TEMPLATE, HEAD[m[i].role]);
        add(b, KVG_SEG_CONTENT, m[i].content, m[i].content_len);
        add_lit(b, KVG_SEG_TEMPLATE, "\n");
    }
    if (gen)
        add_lit(b, KVG_SEG_TEMPLATE, "Assistant:");
}

int kvg_chat_render(kvg_chat_template t, const kvg_chat_message *msgs, size_t n,
                    int add_generation_prompt, kvg_chat_segment *segs, size_t cap,
                    size_t *n_segs, char *err, size_t err_len)
{
    segbuf b = { segs, cap, 0, 0 };

    *n_segs = 0;
    if (n == 0 || !msgs) {
        snprintf(err, err_len, "no messages to render");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!valid_role(msgs[i].role) || (!msgs[i].content && msgs[i].content_len)) {
            snprintf(err, err_len, "message %zu has an invalid role or content", i);
            return -1;
        }
    }
    switch (t) {
    case KVG_TPL_LLAMA2:
        if (render_llama2(msgs, n, &b, err, err_len) < 0)
            return -1;
        break;
    case KVG_TPL_CHATML:
        render_chatml(msgs, n, add_generation_prompt, &b);
        break;
    case KVG_TPL_LLAMA3:
        render_llama3(msgs, n, add_generation_prompt, &b);
        break;
    case KVG_TPL_PLAIN:
        render_plain(msgs, n, add_generation_prompt, &b);
        break;
    default:
        snprintf(err, err_len, "unknown chat template %d", (int)t);
        return -1;
    }
    if (b.overflow) {
        snprintf(err, err_len, "segment array too small (%zu; %zu messages need up to %zu)",
                 cap, n, kvg_chat_max_segments(n));
        return -1;
    }
    *n_segs = b.n;
    return 0;
}

size_t kvg_chat_segments_len(const kvg_chat_segment *segs, size_t n)
{
    size_t total = 0;

    for (size_t i = 0; i < n; i++)
        total += segs[i].len;
    return total;
}

char *kvg_chat_segments_text(const kvg_chat_segment *segs, size_t n, size_t *len)
{
    size_t total = kvg_chat_segments_len(segs, n), off = 0;
    char *s = malloc(total + 1);

    if (!s)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (segs[i].len)
            memcpy(s + off, segs[i].text, segs[i].len);
        off += segs[i].len;
    }
    s[off] = '\0';
    if (len)
        *len = off;
    return s;
}
