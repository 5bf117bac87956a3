/* The Jinja lexer: template source -> tokens, as Jinja2's lexer does it with
 * trim_blocks and lstrip_blocks on (the reference configuration):
 *   - newlines (\r\n, \r, \n) become \n and one trailing newline is dropped
 *     (keep_trailing_newline is off);
 *   - "{%-", "{{-", "{#-" strip all whitespace before the tag, "-%}", "-}}", "-#}"
 *     all whitespace after it;
 *   - lstrip_blocks: spaces and tabs between a line's start and "{%" or "{#" go,
 *     unless the tag opens with "{%+";
 *   - trim_blocks: the newline right after "%}" or "#}" goes, unless "+%}";
 *   - {% raw %}...{% endraw %} is text.
 * Text is copied out with its whitespace already removed, so the parser sees
 * TK_TEXT tokens that print as they are. */
#include "jinja_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
    jarena *a;
    const char *s;              /* normalized source */
    size_t n, pos;
    uint32_t line, col;         /* of pos */
    jtok *toks;
    size_t ntoks, cap;
    char *err;
    size_t err_len;
    int line_starting;          /* the previous tag's match ended with a newline */
} lexer;

static int lx_fail(lexer *L, uint32_t line, uint32_t col, const char *msg)
{
    snprintf(L->err, L->err_len, "%u:%u: %s", line, col, msg);
    return -1;
}

static jtok *lx_push(lexer *L, int type, uint32_t line, uint32_t col)
{
    if (L->ntoks == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jtok *t = ja_alloc(L->a, cap * sizeof *t);

        if (!t)
            return NULL;
        if (L->ntoks)
            memcpy(t, L->toks, L->ntoks * sizeof *t);
        L->toks = t;
        L->cap = cap;
    }
    jtok *t = &L->toks[L->ntoks++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->line = line;
    t->col = col;
    return t;
}

/* moves pos forward by k bytes, keeping line/col */
static void lx_adv(lexer *L, size_t k)
{
    while (k-- && L->pos < L->n) {
        if (L->s[L->pos] == '\n') {
            L->line++;
            L->col = 1;
        } else if (((unsigned char)L->s[L->pos] & 0xC0) != 0x80) {
            L->col++;
        }
        L->pos++;
    }
}

static int is_ws(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static void lx_skip_ws(lexer *L)
{
    while (L->pos < L->n && is_ws(L->s[L->pos]))
        lx_adv(L, 1);
}

/* Emits text s[start..end), after the whitespace control of the tag that follows
 * it: sign is that tag's '-', '+' or 0; block: the tag is {% or {#. */
static int lx_text(lexer *L, size_t start, size_t end, uint32_t line, uint32_t col,
                   char sign, int block)
{
    if (sign == '-') {
        while (end > start && is_ws(L->s[end - 1]))
            end--;
    } else if (sign != '+' && block) {
        size_t l = end;

        while (l > start && L->s[l - 1] != '\n')
            l--;
        if (l > start || L->line_starting) {
            size_t k = l;

            while (k < end && (L->s[k] == ' ' || L->s[k] == '\t' || L->s[k] == '\f' ||
                               L->s[k] == '\v'))
                k++;
            if (k == end)
                end = l;
        }
    }
    if (end > start) {
        jtok *t = lx_push(L, TK_TEXT, line, col);

        if (!t)
            return -1;
        t->p = L->s + start;
        t->n = end - start;
    }
    return 0;
}

/* After a tag's closing: sign '-' strips whitespace, '+' keeps it, else trim_blocks
 * (block tags only) drops one newline. */
static void lx_after_tag(lexer *L, char sign, int block)
{
    if (sign == '-') {
        lx_skip_ws(L);
        L->line_starting = L->pos > 0 && L->s[L->pos - 1] == '\n';
    } else if (sign != '+' && block && L->pos < L->n && L->s[L->pos] == '\n') {
        lx_adv(L, 1);
        L->line_starting = 1;
    } else {
        L->line_starting = 0;
    }
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F)); return 4;
}

/* A string literal at pos (quote included): decoded with Python's escapes. */
static int lx_string(lexer *L, jtok *t)
{
    char q = L->s[L->pos];
    size_t i = L->pos + 1, o = 0;
    char *out;

    /* find the end first: the decoded text is never longer */
    while (i < L->n && L->s[i] != q) {
        if (L->s[i] == '\\')
            i++;
        i++;
    }
    if (i >= L->n)
        return lx_fail(L, t->line, t->col, "unexpected end of string");
    out = ja_alloc(L->a, i - L->pos + 1);
    if (!out)
        return -1;
    for (size_t k = L->pos + 1; k < i; k++) {
        char ch = L->s[k];
        if (ch != '\\') {
            out[o++] = ch;
            continue;
        }
        ch = L->s[++k];
        switch (ch) {
        case 'n': out[o++] = '\n'; break;
        case 't': out[o++] = '\t'; break;
        case 'r': out[o++] = '\r'; break;
        case '\\': out[o++] = '\\'; break;
        case '\'': out[o++] = '\''; break;
        case '"': out[o++] = '"'; break;
        case 'a': out[o++] = '\a'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'v': out[o++] = '\v'; break;
        case '\n': break;               /* line continuation */
        case 'x': case 'u': case 'U': {
            int digits = ch == 'x' ? 2 : ch == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int d = 0; d < digits; d++) {
                int h = k + 1 < i ? hexval(L->s[k + 1]) : -1;
                if (h < 0)
                    return lx_fail(L, t->line, t->col, "truncated \\x/\\u escape in string");
                cp = cp * 16 + (uint32_t)h;
                k++;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
                return lx_fail(L, t->line, t->col, "escape outside Unicode in string");
            o += put_utf8(out + o, cp);
            break;
        }
        default:
            if (ch >= '0' && ch <= '7') {
                uint32_t cp = 0;
                int d = 0;
                k--;
                while (d < 3 && k + 1 < i && L->s[k + 1] >= '0' && L->s[k + 1] <= '7') {
                    cp = cp * 8 + (uint32_t)(L->s[k + 1] - '0');
                    k++;
                    d++;
                }
                o += put_utf8(out + o, cp);
            } else {
                /* Python keeps an unknown escape as it is */
                out[o++] = '\\';
                k--;
            }
        }
    }
    out[o] = 0;
    t->p = out;
    t->n = o;
    lx_adv(L, i + 1 - L->pos);
    return 0;
}

static int lx_number(lexer *L, jtok *t)
{
    size_t i = L->pos;
    char buf[64];
    size_t o = 0;
    int is_float = 0, too_long = 0;

#define PUTB(ch) do { if (o < sizeof buf - 1) buf[o++] = (ch); else too_long = 1; } while (0)
    while (i < L->n && ((L->s[i] >= '0' && L->s[i] <= '9') || L->s[i] == '_')) {
        if (L->s[i] != '_')
            PUTB(L->s[i]);
        i++;
    }
    if (i + 1 < L->n && L->s[i] == '.' && L->s[i + 1] >= '0' && L->s[i + 1] <= '9') {
        is_float = 1;
        PUTB('.');
        i++;
        while (i < L->n && ((L->s[i] >= '0' && L->s[i] <= '9') || L->s[i] == '_')) {
            if (L->s[i] != '_')
                PUTB(L->s[i]);
            i++;
        }
    }
    if (i < L->n && (L->s[i] == 'e' || L->s[i] == 'E')) {
        size_t k = i + 1;
        if (k < L->n && (L->s[k] == '+' || L->s[k] == '-'))
            k++;
        if (k < L->n && L->s[k] >= '0' && L->s[k] <= '9') {
            is_float = 1;
            PUTB('e');
            for (size_t m = i + 1; m < k; m++)
                PUTB(L->s[m]);
            i = k;
            for (; i < L->n && L->s[i] >= '0' && L->s[i] <= '9'; i++)
                PUTB(L->s[i]);
        }
    }
#undef PUTB
    buf[o] = 0;
    if (too_long)
        return lx_fail(L, t->line, t->col, "number literal too long");
    if (is_float) {
        t->type = TK_FLOAT;
        t->f = strtod(buf, NULL);
    } else {
        unsigned long long v = strtoull(buf, NULL, 10);
        if (o > 19 || v > INT64_MAX)
            return lx_fail(L, t->line, t->col, "integer literal out of 64-bit range");
        t->type = TK_INT;
        t->i = (int64_t)v;
    }
    lx_adv(L, i - L->pos);
    return 0;
}

static const struct { const char *s; uint8_t op; } OPS[] = {
    { "//", P_FLOORDIV }, { "**", P_POW }, { "==", P_EQ }, { "!=", P_NE },
    { "<=", P_LE }, { ">=", P_GE },
    { "+", P_ADD }, { "-", P_SUB }, { "/", P_DIV }, { "*", P_MUL }, { "%", P_MOD },
    { "~", P_TILDE }, { "[", P_LBRACKET }, { "]", P_RBRACKET }, { "(", P_LPAREN },
    { ")", P_RPAREN }, { "{", P_LBRACE }, { "}", P_RBRACE }, { "<", P_LT }, { ">", P_GT },
    { "=", P_ASSIGN }, { ".", P_DOT }, { ":", P_COLON }, { "|", P_PIPE }, { ",", P_COMMA },
    { ";", P_SEMI },
};

/* Tokens inside {{ }} or {% %} until the closing, which is emitted too. */
static int lx_tag(lexer *L, int var)
{
    int depth = 0;          /* brackets open: a '}' inside braces is not the end */

    for (;;) {
        lx_skip_ws(L);
        if (L->pos >= L->n)
            return lx_fail(L, L->line, L->col, var ? "unexpected end of template, expected '}}'"
                                                   : "unexpected end of template, expected '%}'");
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        uint32_t line = L->line, col = L->col;
        char sign = 0;
        size_t skip = 0;

        if (depth == 0) {
            char close = var ? '}' : '%';
            if ((p[0] == '-' || p[0] == '+') && left >= 3 && p[1] == close && p[2] == '}') {
                sign = p[0];
                skip = 3;
            } else if (left >= 2 && p[0] == (var ? '}' : '%') && p[1] == '}') {
                skip = 2;
            }
            if (skip) {
                /* '+}}' is not a closing in Jinja2; "-}}" is */
                if (var && sign == '+')
                    return lx_fail(L, line, col, "unexpected '+'");
                if (!lx_push(L, var ? TK_VAR_END : TK_BLOCK_END, line, col))
                    return -1;
                lx_adv(L, skip);
                lx_after_tag(L, sign, !var);
                return 0;
            }
        }
        jtok *t = lx_push(L, TK_OP, line, col);
        if (!t)
            return -1;
        if (p[0] == '\'' || p[0] == '"') {
            t->type = TK_STRING;
            if (lx_string(L, t) < 0)
                return -1;
            continue;
        }
        if (p[0] >= '0' && p[0] <= '9') {
            if (lx_number(L, t) < 0)
                return -1;
            continue;
        }
        if ((p[0] >= 'a' && p[0] <= 'z') || (p[0] >= 'A' && p[0] <= 'Z') || p[0] == '_') {
            size_t k = 1;
            while (k < left && ((p[k] >= 'a' && p[k] <= 'z') || (p[k] >= 'A' && p[k] <= 'Z') ||
                                (p[k] >= '0' && p[k] <= '9') || p[k] == '_'))
                k++;
            t->type = TK_NAME;
            t->p = p;
            t->n = k;
            lx_adv(L, k);
            continue;
        }
        size_t i;
        for (i = 0; i < sizeof OPS / sizeof OPS[0]; i++) {
            size_t k = strlen(OPS[i].s);
            if (k <= left && memcmp(p, OPS[i].s, k) == 0) {
                t->op = OPS[i].op;
                if (t->op == P_LBRACE || t->op == P_LBRACKET || t->op == P_LPAREN)
                    depth++;
                else if ((t->op == P_RBRACE || t->op == P_RBRACKET || t->op == P_RPAREN) && depth)
                    depth--;
                lx_adv(L, k);
                break;
            }
        }
        if (i == sizeof OPS / sizeof OPS[0]) {
            char msg[64];
            snprintf(msg, sizeof msg, "unexpected character '%c'",
                     (unsigned char)p[0] >= 0x20 && (unsigned char)p[0] < 0x7f ? p[0] : '?');
            return lx_fail(L, line, col, msg);
        }
    }
}

/* "{% raw %}" (with its whitespace signs) at pos? Returns the length, 0 if not. */
static size_t raw_open(const char *p, size_t left, char *close_sign)
{
    size_t k = 2;

    if (k < left && (p[k] == '-' || p[k] == '+'))
        k++;
    while (k < left && is_ws(p[k]))
        k++;
    if (left - k < 3 || memcmp(p + k, "raw", 3) != 0)
        return 0;
    k += 3;
    while (k < left && is_ws(p[k]))
        k++;
    *close_sign = 0;
    if (k < left && (p[k] == '-' || p[k] == '+'))
        *close_sign = p[k++];
    if (left - k < 2 || p[k] != '%' || p[k + 1] != '}')
        return 0;
    return k + 2;
}

static int lx_raw(lexer *L, size_t open_len, char close_sign)
{
    uint32_t line = L->line, col = L->col;

    lx_adv(L, open_len);
    /* Jinja2 strips after "{% raw -%}" but does not trim_blocks "{% raw %}" */
    lx_after_tag(L, close_sign == '-' ? '-' : '+', 1);
    size_t start = L->pos;
    for (size_t i = L->pos; i + 1 < L->n; i++) {
        if (L->s[i] != '{' || L->s[i + 1] != '%')
            continue;
        size_t k = i + 2;
        char sign = 0, end_sign = 0;
        if (k < L->n && (L->s[k] == '-' || L->s[k] == '+'))
            sign = L->s[k++];
        while (k < L->n && is_ws(L->s[k]))
            k++;
        if (L->n - k < 6 || memcmp(L->s + k, "endraw", 6) != 0)
            continue;
        k += 6;
        while (k < L->n && is_ws(L->s[k]))
            k++;
        if (k < L->n && (L->s[k] == '-' || L->s[k] == '+'))
            end_sign = L->s[k++];
        if (L->n - k < 2 || L->s[k] != '%' || L->s[k + 1] != '}')
            continue;
        L->line_starting = 0;
        if (lx_text(L, start, i, line, col, sign, 1) < 0)
            return -1;
        lx_adv(L, k + 2 - L->pos);
        lx_after_tag(L, end_sign, 1);
        return 0;
    }
    return lx_fail(L, line, col, "missing endraw");
}

int jinja_lex(jarena *a, const char *src, size_t len, jtok **toks, size_t *ntoks,
              char *err, size_t err_len)
{
    lexer L = { .a = a, .line = 1, .col = 1, .err = err, .err_len = err_len,
                .line_starting = 1 };
    char *s = ja_alloc(a, len + 1);
    size_t n = 0;

    if (!s)
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    s[n] = 0;
    L.s = s;
    L.n = n;

    while (L.pos < L.n) {
        size_t start = L.pos, i = L.pos;
        uint32_t line = L.line, col = L.col;

        /* the next tag opening */
        while (i + 1 < L.n && !(L.s[i] == '{' && (L.s[i + 1] == '{' || L.s[i + 1] == '%' ||
                                                  L.s[i + 1] == '#')))
            i++;
        if (i + 1 >= L.n) {
            if (lx_text(&L, start, L.n, line, col, 0, 0) < 0)
                return -1;
            break;
        }
        char kind = L.s[i + 1];
        char sign = i + 2 < L.n && (L.s[i + 2] == '-' || L.s[i + 2] == '+') ? L.s[i + 2] : 0;
        char raw_sign;
        size_t raw_len = kind == '%' ? raw_open(L.s + i, L.n - i, &raw_sign) : 0;

        if (kind == '{' && sign == '+')
            sign = 0;       /* "{{+" is "{{" then a unary plus */
        if (lx_text(&L, start, i, line, col, sign, kind != '{') < 0)
            return -1;
        lx_adv(&L, i - L.pos);
        if (raw_len) {
            if (lx_raw(&L, raw_len, raw_sign) < 0)
                return -1;
            continue;
        }
        line = L.line;
        col = L.col;
        if (kind == '#') {
            /* a comment: up to "#}", whose sign works as a block's */
            size_t k = i + 2;
            while (k + 1 < L.n && !(L.s[k] == '#' && L.s[k + 1] == '}'))
                k++;
            if (k + 1 >= L.n)
                return lx_fail(&L, line, col, "missing end of comment tag");
            char esign = k > i + 2 && (L.s[k - 1] == '-' || L.s[k - 1] == '+') ? L.s[k - 1] : 0;
            if (esign == '+')
                esign = 0;
            lx_adv(&L, k + 2 - L.pos);
            lx_after_tag(&L, esign, 1);
            continue;
        }
        if (!lx_push(&L, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, line, col))
            return -1;
        lx_adv(&L, 2 + (sign && kind != '{' ? 1 : 0) + (sign == '-' && kind == '{' ? 1 : 0));
        if (lx_tag(&L, kind == '{') < 0)
            return -1;
    }
    if (!lx_push(&L, TK_EOF, L.line, L.col))
        return -1;
    *toks = L.toks;
    *ntoks = L.ntoks;
    return 0;
}
