/* kvg_jinja (jinja.h): Jinja2 semantics as transformers' apply_chat_template uses
 * them, the data spans of the output, compile errors with LINE:COL, and limits.
 *
 * CASES' expected outputs come from Jinja2 itself: t/tools/jinja_cases.py prints
 * the table (rerun it when adding cases). The whole-template comparison against
 * Jinja2 over real chat templates is t/tools/jinja_cmp.py. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja.h"
#include "tap.h"

#define ERROR ((const char *)1)
#define RAISED ((const char *)2)

/* context of every CASES entry: data (as jinja_cases.py's CTX) and trusted */
static const char *const CTX_DATA =
    "{\"xs\": [1, 2, 3], \"d\": {\"a\": 1, \"b\": \"x\"}, \"s\": \"hello\", \"n\": null, \"f\": 2.5,"
    " \"ws\": \"  pad  \", \"u\": \"H\\u00e9\\u65e5\\ud83d\\ude00\", \"msgs\": ["
    "{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"},"
    "{\"role\": \"assistant\", \"content\": \"yo\", \"tool_calls\": [{\"function\": {\"name\": \"f\","
    " \"arguments\": {\"k\": \"v\", \"n\": 1}}}]}]}";
static const char *const CTX_TRUSTED = "{\"bos_token\": \"<s>\"}";
#define NOW ((time_t)1767225600 + 3600 * 13)

static const struct { const char *src, *want; } CASES[] = {
    { "{{ 'a' }}{{ \"b\" }}{{ 'it''s' }}",
      "abits" },
    { "{{ 'a\\tb\\n\\x41\\u00e9' }}",
      "a\tb\nA\303\251" },
    { "{{ 42 }}|{{ -7 }}|{{ 1_000 }}",
      "42|-7|1000" },
    { "{{ 1.0 }}|{{ 0.1 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ 2.5e-7 }}|{{ 1/3 }}",
      "1.0|0.1|1e+16|1000000000000000.0|1e-05|0.0001|2.5e-07|0.3333333333333333" },
    { "{{ true }}{{ True }}{{ false }}{{ none }}{{ None }}",
      "TrueTrueFalseNoneNone" },
    { "{{ [1, 'a', none, true, 1.5] }}",
      "[1, 'a', None, True, 1.5]" },
    { "{{ {'a': 1, 'b': [2]} }}",
      "{'a': 1, 'b': [2]}" },
    { "{{ (1,) }}{{ (1, 2) }}{{ () }}",
      "(1,)(1, 2)()" },
    { "{{ ['it\\'s', \"q\\\"q\", 'x\\ny', '\\x01'] }}",
      "[\"it's\", 'q\"q', 'x\\ny', '\\x01']" },
    { "{{ d }}|{{ xs }}|{{ msgs[2].tool_calls }}",
      "{'a': 1, 'b': 'x'}|[1, 2, 3]|[{'function': {'name': 'f', 'arguments': {'k': 'v', 'n': 1}}}]" },
    { "{{ undefined_var }}|{{ n }}",
      "|None" },
    { "{{ 1, 2 }}",
      "(1, 2)" },
    { "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}",
      "3 -4 2 -2 3.5 2.0 1024 0.5" },
    { "{{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
      "64 4 7 9 3.0 0.5" },
    { "{{ 'ab' * 3 }}{{ [1] * 2 }}{{ 'a' + 'b' }}{{ [1] + [2] }}{{ 1 + 2.5 }}{{ true + 1 }}",
      "ababab[1, 1]ab[1, 2]3.52" },
    { "{{ 'a' ~ 1 ~ none ~ [1] }}",
      "a1None[1]" },
    { "{{ 9223372036854775807 }}",
      "9223372036854775807" },
    { "{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 1 == 1.0 }}{{ 'a' != 'b' }}{{ [1,2] == [1,2] }}{{ (1,2) == [1,2] }}",
      "TrueFalseTrueTrueTrueFalse" },
    { "{{ 'a' < 'b' }}{{ [1,2] < [1,3] }}{{ 'ell' in s }}{{ 2 in xs }}{{ 'a' in d }}{{ 'z' not in d }}",
      "TrueTrueTrueTrueTrueTrue" },
    { "{{ 0 or 'x' }}|{{ 1 and 'y' }}|{{ '' and 1 }}|{{ none or 0 }}|{{ not 0 }}|{{ not xs }}",
      "x|y||0|True|False" },
    { "{{ 'y' if xs else 'n' }}|{{ 'y' if [] else 'n' }}|{{ 'y' if false }}|",
      "y|n||" },
    { "{{ xs[0] }}{{ xs[-1] }}{{ xs.1 }}{{ d.a }}{{ d['b'] }}{{ s[1] }}{{ s[-1] }}{{ xs[5] }}|{{ d.zz }}",
      "1321xeo|" },
    { "{{ s[1:3] }}|{{ s[::-1] }}|{{ s[::2] }}|{{ xs[::-1] }}|{{ xs[1:] }}|{{ xs[:-1] }}|{{ s[10:] }}|{{ xs[-2::-1] }}",
      "el|olleh|hlo|[3, 2, 1]|[2, 3]|[1, 2]||[2, 1]" },
    { "{{ u|length }}|{{ u[1] }}|{{ u[-1] }}|{{ u[1:3] }}|{{ u[::-1] }}|{{ u|upper }}",
      "4|\303\251|\360\237\230\200|\303\251\346\227\245|\360\237\230\200\346\227\245\303\251H|H\303\211\346\227\245\360\237\230\200" },
    { "{{ msgs[0].role }}{{ msgs[0]['content'] }}{{ msgs[2].tool_calls[0].function.arguments.k }}",
      "systemsysv" },
    { "{{ d.items() }}",
      "dict_items([('a', 1), ('b', 'x')])" },
    { "{{ d.keys()|list }}{{ d.values()|list }}{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 5) }}",
      "['a', 'b'][1, 'x']1None5" },
    { "{% if 0 %}a{% elif 1 %}b{% else %}c{% endif %}",
      "b" },
    { "{% for x in xs %}{{ x }}{% else %}E{% endfor %}",
      "123" },
    { "{% for x in [] %}{{ x }}{% else %}E{% endfor %}",
      "E" },
    { "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
      "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;" },
    { "{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('a', 'b') }};{% endfor %}",
      "-2-a;1-3-b;2--a;" },
    { "{% for x in xs if x != 2 %}{{ x }}{{ loop.length }}{% endfor %}",
      "1232" },
    { "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
      "a=1;b=x;ab" },
    { "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}",
      "37" },
    { "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
      "1" },
    { "{% for x in xs %}{% set y = x %}{% endfor %}{{ y }}|{% set ns = namespace(t=0) %}{% for x in xs %}{% set ns.t = ns.t + x %}{% endfor %}{{ ns.t }}",
      "|6" },
    { "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = [3, 4] %}{% set e, f = c %}{{ e }}{{ f }}",
      "1234" },
    { "{% set x %}in {{ s }}{% endset %}[{{ x }}]{% set y | upper %}up{% endset %}{{ y }}",
      "[in hello]UP" },
    { "{% macro m(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }} {{ m(b=4, a=5) }}",
      "1-2 1-3 5-4" },
    { "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, z=3) }}",
      "1(2,){'z': 3}" },
    { "{% macro outer() %}[{{ caller('x') }}]{% endmacro %}{% call(v) outer() %}c{{ v }}{% endcall %}",
      "[cx]" },
    { "{% macro rec(n) %}{{ n }}{% if n > 0 %}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}",
      "3210" },
    { "{% set g = 1 %}{% macro m() %}{{ g }}{% endmacro %}{% set g = 2 %}{{ m() }}",
      "2" },
    { "{% filter upper %}ab{{ s }}{% endfilter %}",
      "ABHELLO" },
    { "{% raw %}{{ x }}{% endraw %}",
      "{{ x }}" },
    { "{# c #}a{# d #}",
      "a" },
    { "{% generation %}gen{{ 1 }}{% endgeneration %}",
      "gen1" },
    { "{% set a = 5 %}{% with a = 1, b = a %}{{ a }}{{ b }}{% endwith %}{{ a }}{% with %}{% set q = 1 %}{{ q }}{% endwith %}{{ q }}",
      "1551" },
    { "a  {%- if 1 %}  b  {% endif -%}  c",
      "a  b  c" },
    { "a\n  {% if 1 %}\n  b\n  {% endif %}\nc",
      "a\n  b\nc" },
    { "a {{- ' b ' -}} c",
      "a b c" },
    { "x\n    {%+ if 1 %}y{% endif +%}\nz",
      "x\n    y\nz" },
    { "  {# c #}\nx",
      "x" },
    { "a {#- c -#} b",
      "ab" },
    { "<{{ 1 }}>\n",
      "<1>" },
    { "line\r\nnext\rlast\n\n",
      "line\nnext\nlast\n" },
    { "{% if 1 %}\n\n{% endif %}",
      "\n" },
    { "{{ ws|trim }}|{{ 'xxaxx'|trim('x') }}|{{ none|trim }}|{{ ws|length }}|{{ xs|count }}|{{ d|length }}",
      "pad|a|None|7|3|2" },
    { "{{ s|upper }}{{ 'ABC'|lower }}{{ 'hello world-x (y)'|title }}{{ 'hELLO'|capitalize }}",
      "HELLOabcHello World-X (Y)Hello" },
    { "{{ s|replace('l', 'L') }}|{{ s|replace('l', 'L', 1) }}|{{ 'ab'|replace('', '-') }}",
      "heLLo|heLlo|-a-b-" },
    { "{{ xs|join(',') }}|{{ xs|join }}|{{ msgs|join('/', attribute='role') }}",
      "1,2,3|123|system/user/assistant" },
    { "{{ xs|first }}{{ xs|last }}{{ []|first }}|{{ s|first }}|{{ xs|list }}{{ s|list }}{{ d|list }}",
      "13|h|[1, 2, 3]['h', 'e', 'l', 'l', 'o']['a', 'b']" },
    { "{{ d|items|list }}|{{ {'b': 1, 'A': 2, 'a': 3}|dictsort }}|{{ {'b': 1, 'a': 2}|dictsort(by='value', reverse=true) }}",
      "[('a', 1), ('b', 'x')]|[('A', 2), ('a', 3), ('b', 1)]|[('a', 2), ('b', 1)]" },
    { "{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}|{{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='role')|join(',') }}",
      "1|system,assistant" },
    { "{{ xs|select('odd')|list }}{{ xs|reject('odd')|list }}{{ [0, 1, '', 'a']|select|list }}{{ xs|map('string')|join('-') }}",
      "[1, 3][2][1, 'a']1-2-3" },
    { "{{ msgs|map(attribute='zz', default='D')|list }}|{{ msgs|selectattr('tool_calls', 'defined')|list|length }}",
      "['D', 'D', 'D']|1" },
    { "{{ n|default('x') }}|{{ zz|default('y') }}|{{ ''|default('z', true) }}|{{ zz|d('w') }}",
      "None|y|z|w" },
    { "{{ '12'|int + 1 }}|{{ 3.9|int }}|{{ 'x'|int }}|{{ 'x'|int(7) }}|{{ '3.5'|int }}|{{ '2'|float }}|{{ 'a'|float }}",
      "13|3|0|7|3|2.0|0.0" },
    { "{{ 12|string ~ 'x' }}|{{ xs|string }}|{{ -3|abs }}|{{ 2.5|round }}|{{ 3.14159|round(2) }}|{{ 2.7|round(0, 'floor') }}",
      "12x|[1, 2, 3]|3|2.0|3.14|2.0" },
    { "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(1, blank=true) }}|{{ 'a\\nb'|indent('> ') }}",
      "a\n    b\n\n    c|  a\n  b|a\n \n b|a\n> b" },
    { "{{ [3, 1, 2]|sort }}|{{ ['b', 'A', 'c']|sort }}|{{ [3, 1]|sort(reverse=true) }}|{{ msgs|sort(attribute='role')|map(attribute='role')|join(',') }}",
      "[1, 2, 3]|['A', 'b', 'c']|[3, 1]|assistant,system,user" },
    { "{{ [1, 2, 1, 3]|unique|list }}|{{ ['a', 'A']|unique|list }}|{{ xs|min }}{{ xs|max }}{{ xs|sum }}{{ ['b', 'A']|max }}|{{ [1.5, 2]|sum }}",
      "[1, 2, 3]|['a']|136b|3.5" },
    { "{{ xs|reverse|list }}|{{ s|reverse }}|{{ 'a b  c'|wordcount }}|{{ '%s=%d %05.1f %r %%'|format('k', 3, 2.25, 'q') }}",
      "[3, 2, 1]|olleh|3|k=3 002.2 'q' %" },
    { "{{ 'x'|center(5) }}|{{ 'hello world foo'|truncate(9) }}|{{ xs|batch(2)|list }}|{{ '<a&\"b\\'>'|escape }}|{{ s|safe }}",
      "  x  |hello...|[[1, 2], [3]]|&lt;a&amp;&#34;b&#39;&gt;|hello" },
    { "{{ xs|tojson }}|{{ d|tojson }}|{{ msgs[2]|tojson }}|{{ '\303\251\"\\n\\u0001'|tojson }}|{{ 1.0|tojson }}|{{ none|tojson }}",
      "[1, 2, 3]|{\"a\": 1, \"b\": \"x\"}|{\"role\": \"assistant\", \"content\": \"yo\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"k\": \"v\", \"n\": 1}}}]}|\"\303\251\\\"\\n\\u0001\"|1.0|null" },
    { "{{ d|tojson(indent=2) }}|{{ []|tojson(indent=2) }}|{{ {'b': 1, 'a': [1, {}]}|tojson(sort_keys=true, indent=1) }}",
      "{\n  \"a\": 1,\n  \"b\": \"x\"\n}|[]|{\n \"a\": [\n  1,\n  {}\n ],\n \"b\": 1\n}" },
    { "{{ d|tojson(separators=(',', ':')) }}|{{ '\303\251\360\237\230\200'|tojson(ensure_ascii=true) }}|{{ {1: 2, true: 3}|tojson }}",
      "{\"a\":1,\"b\":\"x\"}|\"\\u00e9\\ud83d\\ude00\"|{\"1\": 3}" },
    { "{{ zz is defined }}{{ s is defined }}{{ zz is undefined }}{{ n is none }}{{ s is string }}{{ 1 is number }}{{ 1.5 is float }}{{ 1 is integer }}{{ true is integer }}",
      "FalseTrueTrueTrueTrueTrueTrueTrueFalse" },
    { "{{ true is boolean }}{{ d is mapping }}{{ xs is iterable }}{{ s is iterable }}{{ 1 is iterable }}{{ xs is sequence }}{{ d is sequence }}{{ true is true }}{{ 0 is false }}",
      "TrueTrueTrueTrueFalseTrueTrueTrueFalse" },
    { "{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 1 is equalto 1 }}{{ 2 is eq 3 }}{{ 2 is in xs }}{{ 'ab' is lower }}{{ 'AB' is upper }}",
      "TrueTrueTrueFalseTrueFalseTrueTrueTrue" },
    { "{{ none is sameas none }}{{ xs is sameas xs }}{{ range is callable }}{{ s is not string }}{{ s is not none }}{{ 2 is gt 1 }}{{ 2 is le 1 }}",
      "TrueTrueTrueFalseTrueTrueFalse" },
    { "{{ ws.strip() }}|{{ ws.lstrip() }}|{{ ws.rstrip() }}|{{ 'xyax'.strip('xy') }}|{{ '\\n\\na\\n'.lstrip('\\n') }}",
      "pad|pad  |  pad|a|a\n" },
    { "{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ' a b '.rsplit(None, 1) }}",
      "['a', 'b', '', 'c']['a', 'b']['a', 'b,c']['a,b', 'c'][' a', 'b']" },
    { "{{ s.startswith('he') }}{{ s.endswith(('x', 'lo')) }}{{ s.upper() }}{{ s.title() }}{{ s.capitalize() }}{{ 'Hello'.swapcase() }}",
      "TrueTrueHELLOHelloHellohELLO" },
    { "{{ s.replace('l', '') }}{{ s.find('l') }}{{ s.rfind('l') }}{{ s.find('z') }}{{ s.index('e') }}{{ s.count('l') }}{{ '-'.join(['a', 'b']) }}",
      "heo23-112a-b" },
    { "{{ '{}-{}'.format(1, 'b') }}|{{ '{0}{x}'.format(1, x=2) }}|{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}{{ 'Ab'.isupper() }}",
      "1-b|12|TrueTrueTrueFalse" },
    { "{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ 'ab'.zfill(4) }}|{{ 'a=b'.partition('=') }}|{{ 'pre_x'.removeprefix('pre_') }}",
      "['a', 'b', 'c']|00ab|('a', '=', 'b')|x" },
    { "{{ xs.index(2) }}{{ [1, 1, 2].count(1) }}{{ msgs[0].get('role') }}{{ msgs[0].items()|list|length }}",
      "12system2" },
    { "{{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ range(3, 0, -1)|list }}{{ dict(a=1) }}{{ namespace(x=1).x }}",
      "[0, 1, 2][1, 3, 5][3, 2, 1]{'a': 1}1" },
    { "{{ strftime_now('%Y-%m-%d') }}",
      "2026-01-01" },
    { "{{ raise_exception('boom') }}", RAISED },
    { "{{ zz.attr }}", ERROR },
    { "{{ 1 + 'a' }}", ERROR },
    { "{{ 1 / 0 }}", ERROR },
    { "{{ xs.append(4) }}", ERROR },
    { "{{ s.nosuch() }}", ERROR },
    { "{{ n|length }}", ERROR },
    { "{{ zz|tojson }}", ERROR },
    /* Python's ints grow; ours stop at 64 bits with an error (on purpose) */
    { "{{ 9223372036854775807 + 1 }}", ERROR },
    { "{{ xs|map('upper')|length }}", ERROR },
    { "{% for a, b in xs %}{% endfor %}", ERROR },
    { "{{ 1 < 'a' }}", ERROR },
    { "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", ERROR },
    { "{{ 15|round(-1) }}{{ 25|round(-1) }}{{ 3|round(2) }}{{ [none, zz] }}",
      "20203[None, Undefined]" },
    { "{{ [] in d }}", ERROR },
    { "{{ []|last|int }}", ERROR },
    { "{{ f|indent(2) }}", ERROR },
    { "{{ ' a b c '.split(None, 1) }}{{ ' a b c '.rsplit(None, 1) }}",
      "['a', 'b c '][' a b', 'c']" },
    { "{{ none|selectattr('x')|list }}{{ none|map('upper')|list }}",
      "[][]" },
    { "{{ 'a'|safe + '<b>' }}{{ '<'|escape ~ '<' }}",
      "a&lt;b&gt;&lt;<" },
    { "a\n  {% raw %}\n  x\n  {% endraw %}\nb",
      "a\n\n  x\nb" },
    { "{{ [0, 1, 2]|reject|list }}{{ [0, 1]|select|list }}",
      "[0][1]" },
    { "{{ '%s-%d' % ('a', 3) }}{{ 'A b' % d }}{{ '%s' % xs }}{{ '%5.1f%%' % 2.25 }}",
      "a-3A b[1, 2, 3]  2.2%" },
    { "{{ 'x' % 1 }}", ERROR },
    { "{{ d|attr('a') }}|{{ s|attr('upper') is callable }}|{{ xs|attr('append') }}|{{ xs.append }}",
      "|True||" },
    { "{{ xs['append'](1) }}", ERROR },
};

static json_t *js(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);

    if (!j)
        diag("bad JSON in test: %s", e.text);
    return j;
}

/* compile + render; returns the render code (-1: compile failed), out filled on 0 */
static int run(const char *src, const char *trusted, const char *data, const kvg_jinja_limits *lim,
               kvg_jinja_output *out, char *err, size_t err_len)
{
    kvg_jinja *t = kvg_jinja_compile(src, strlen(src), "t", err, err_len);
    json_t *tj = trusted ? js(trusted) : NULL, *dj = data ? js(data) : NULL;
    kvg_jinja_limits l = { .now = NOW };
    int rc = -1;

    if (lim)
        l = *lim;
    if (t)
        rc = kvg_jinja_render(t, tj, dj, &l, out, err, err_len);
    kvg_jinja_free(t);
    json_decref(tj);
    json_decref(dj);
    return rc;
}

/* src with newlines escaped, for a TAP test name */
static const char *esc(const char *src)
{
    static char buf[4][600];
    static int k;
    char *o = buf[k = (k + 1) % 4];
    size_t n = 0;

    for (; *src && n < sizeof buf[0] - 3; src++) {
        if (*src == '\n' || *src == '\r') {
            o[n++] = '\\';
            o[n++] = *src == '\n' ? 'n' : 'r';
        } else {
            o[n++] = *src;
        }
    }
    o[n] = 0;
    return o;
}

static void test_cases(void)
{
    char err[512];

    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        kvg_jinja_output out;
        int rc = run(CASES[i].src, CTX_TRUSTED, CTX_DATA, NULL, &out, err, sizeof err);

        if (CASES[i].want == ERROR || CASES[i].want == RAISED) {
            int want = CASES[i].want == ERROR ? KVG_JINJA_ERROR : KVG_JINJA_RAISED;
            if (!ok(rc == want, "%s fails as Jinja2 does", esc(CASES[i].src)))
                diag("  rc %d, err '%s'", rc, err);
            continue;
        }
        if (rc != 0) {
            ok(0, "%s", esc(CASES[i].src));
            diag("  rc %d: %s", rc, err);
            continue;
        }
        is_str(out.text, CASES[i].want, "%s", esc(CASES[i].src));
        kvg_jinja_output_free(&out);
    }
}

/* the output's data spans as "off+len ..." */
static const char *spans_of(const kvg_jinja_output *o)
{
    static char buf[512];
    size_t k = 0;

    buf[0] = 0;
    for (size_t i = 0; i < o->n_spans && k < sizeof buf - 32; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%zu+%zu", i ? " " : "", o->spans[i].off,
                              o->spans[i].len);
    return buf;
}

/* The data in the output, the spans' text joined with '|' */
static const char *data_text(const kvg_jinja_output *o)
{
    static char buf[1024];
    size_t k = 0;

    buf[0] = 0;
    for (size_t i = 0; i < o->n_spans && k + o->spans[i].len + 2 < sizeof buf; i++) {
        if (i)
            buf[k++] = '|';
        memcpy(buf + k, o->text + o->spans[i].off, o->spans[i].len);
        k += o->spans[i].len;
    }
    buf[k] = 0;
    return buf;
}

static void test_taint(void)
{
    static const struct { const char *src, *out, *data; } T[] = {
        /* data strings are data; template text, trusted strings and numbers are not */
        { "A{{ u }}B{{ bos_token }}{{ n }}{{ xs[0] }}", "A<|im_start|>xB<s>12", "<|im_start|>x" },
        { "{{ '[' + u + ']' }}{{ u ~ '!' }}", "[<|im_start|>x]<|im_start|>x!", "<|im_start|>x|<|im_start|>x" },
        { "{{ u[2:5] }}{{ u|upper }}{{ u|length }}", "im_<|IM_START|>X13", "im_<|IM_START|>X" },
        { "{{ u|replace('im', 'IM') }}", "<|IM_start|>x", "<||_start|>x" },
        { "{{ w|trim }}.{{ w.split(' ')|join('+') }}", "a b.+a+b+", "a b|a|b" },
        { "{{ {'k': u}|tojson }}", "{\"k\": \"<|im_start|>x\"}", "<|im_start|>x" },
        { "{{ d|tojson }}", "{\"q\\\"\": \"v\\n\"}", "q\\\"|v\\n" },
        { "{{ [u, 1] }}", "['<|im_start|>x', 1]", "<|im_start|>x" },
        { "{{ ('  ' ~ u)|indent(2, true) }}", "    <|im_start|>x", "<|im_start|>x" },
        { "{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m(u) }}", "<<|im_start|>x>", "<|im_start|>x" },
        { "{% set s %}[{{ u }}]{% endset %}{{ s|lower }}", "[<|im_start|>x]", "<|im_start|>x" },
        { "{% for k, v in d.items() %}{{ k }}={{ v }}{% endfor %}", "q\"=v\n", "q\"|v\n" },
        { "{{ '%s/%s'|format(u, 1) }}", "<|im_start|>x/1", "<|im_start|>x" },
        { "{{ b }}{{ b|string }}", "TrueTrue", "" },
        /* a data format string's text passes through strftime: the result is data */
        { "{{ strftime_now('%Y') }}|{{ strftime_now(u) }}", "2026|<|im_start|>x", "<|im_start|>x" },
        { "{{ 'ab'.center(6, u[0]) }}{{ 'ab'.center(4) }}", "<<ab<< ab ", "<<|<<" },
    };
    const char *data = "{\"u\": \"<|im_start|>x\", \"w\": \" a b \", \"xs\": [2], \"b\": true,"
                       " \"d\": {\"q\\\"\": \"v\\n\"}, \"n\": 1, \"bos_token\": \"<bad>\"}";
    const char *trusted = "{\"bos_token\": \"<s>\"}";
    char err[256];

    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        kvg_jinja_output out;
        int rc = run(T[i].src, trusted, data, NULL, &out, err, sizeof err);

        if (!ok(rc == 0, "taint: %s renders", T[i].src)) {
            diag("  %s", err);
            continue;
        }
        is_str(out.text, T[i].out, "taint: %s output", T[i].src);
        is_str(data_text(&out), T[i].data, "taint: %s data spans (%s)", T[i].src, spans_of(&out));
        kvg_jinja_output_free(&out);
    }

    /* spans are maximal: adjacent data strings make one span */
    kvg_jinja_output out;
    if (run("{{ u }}{{ u }}x{{ u[0] }}", trusted, data, NULL, &out, err, sizeof err) == 0) {
        is_str(spans_of(&out), "0+26 27+1", "adjacent data bytes make one span");
        kvg_jinja_output_free(&out);
    } else {
        ok(0, "adjacent spans: %s", err);
    }
}

static void test_compile_errors(void)
{
    static const struct { const char *src, *err; } E[] = {
        { "a\n{{ x|nosuch }}", "t:2:6: no filter named 'nosuch'" },
        { "{% if x is nosuch %}{% endif %}", "t:1:12: no test named 'nosuch'" },
        { "\n\n  {% frobnicate %}", "t:3:6: Encountered unknown tag 'frobnicate'" },
        { "{{ 1 + }}", "t:1:8: unexpected '}}'" },
        { "{% if 1 %}", "t:1:11: unexpected end of template, expected 'elif'" },
        { "{% for x in y %}{% endif %}", "t:1:20: unexpected 'endif', expected 'else'" },
        { "{{ 'abc }}", "t:1:4: unexpected end of string" },
        { "{% break %}", "t:1:4: 'break' outside loop" },
        { "{{ x is defined is none }}", "t:1:17: You cannot chain multiple tests with is" },
        { "{{ 99999999999999999999 }}", "t:1:4: integer literal out of 64-bit range" },
        { "{% include 'x' %}", "t:1:4: Encountered unknown tag 'include'" },
        { "ok\n{{ \xff }}", "t:2:4: invalid UTF-8" },
        /* found by fuzzing: a long exponent looped forever */
        { "{{ 1e7777777777777777777777777777777777777777777777777777777777777777777777777777 }}",
          "t:1:4: number literal too long" },
    };
    char err[256];

    for (size_t i = 0; i < sizeof E / sizeof E[0]; i++) {
        kvg_jinja *t = kvg_jinja_compile(E[i].src, strlen(E[i].src), "t", err, sizeof err);
        ok(t == NULL, "compile error: %s", E[i].err);
        is_str(err, E[i].err, "  its message");
        kvg_jinja_free(t);
    }

    /* 100k '(' fails cleanly (no stack overflow), and so does 100k nested ifs */
    size_t n = 100000;
    char *deep = malloc(2 * n + 16);
    memcpy(deep, "{{ ", 3);
    memset(deep + 3, '(', n);
    deep[3 + n] = '1';
    memset(deep + 4 + n, ')', n);
    memcpy(deep + 4 + 2 * n, " }}", 4);
    kvg_jinja *t = kvg_jinja_compile(deep, strlen(deep), "t", err, sizeof err);
    ok(t == NULL && strstr(err, "nesting too deep"), "100k '(' refused: %s", err);
    free(deep);
    deep = malloc(n * 11 + 1);
    for (size_t i = 0; i < n; i++)
        memcpy(deep + i * 11, "{% if 1 %}\n", 11);
    deep[n * 11] = 0;
    t = kvg_jinja_compile(deep, strlen(deep), "t", err, sizeof err);
    ok(t == NULL && strstr(err, "nesting too deep"), "100k nested ifs refused: %s", err);
    free(deep);
}

static void test_render_errors(void)
{
    char err[256];
    kvg_jinja_output out;

    is_int(run("{{ raise_exception('no system role') }}", NULL, NULL, NULL, &out, err, sizeof err),
           KVG_JINJA_RAISED, "raise_exception: RAISED");
    is_str(err, "no system role", "  err is the message");
    is_int(run("a\n  {{ x.y }}", NULL, NULL, NULL, &out, err, sizeof err), KVG_JINJA_ERROR,
           "attribute of undefined: ERROR");
    is_str(err, "t:2:7: 'x' is undefined", "  naming the line");
    is_int(run("{{ m.content.foo() }}", NULL, "{\"m\": {\"content\": \"c\"}}", NULL, &out, err,
               sizeof err), KVG_JINJA_ERROR, "unknown method: ERROR");
    is_str(err, "t:1:17: 'str object' has no attribute 'foo'", "  its message");
    is_int(run("{{ messages.pop() }}", NULL, "{\"messages\": [1]}", NULL, &out, err, sizeof err),
           KVG_JINJA_ERROR, "list.pop refused (immutable sandbox)");
    is_str(err, "t:1:16: access to attribute 'pop' of 'list' object is unsafe.", "  its message");
    is_int(run("{{ 2 ** 64 }}", NULL, NULL, NULL, &out, err, sizeof err), KVG_JINJA_ERROR,
           "integer overflow: ERROR");
}

static void test_limits(void)
{
    char err[256];
    kvg_jinja_output out;
    kvg_jinja_limits lim = { .max_output = 100, .now = NOW };

    is_int(run("{% for i in range(200) %}x{% endfor %}", NULL, NULL, &lim, &out, err, sizeof err),
           KVG_JINJA_LIMIT, "output limit");
    ok(strstr(err, "output limit") != NULL, "  says so: %s", err);
    is_int(run("{{ 'x' * 1000 }}", NULL, NULL, &lim, &out, err, sizeof err), KVG_JINJA_LIMIT,
           "output limit on a string built in one go");
    is_int(run("{% for i in range(100) %}x{% endfor %}", NULL, NULL, &lim, &out, err, sizeof err),
           KVG_JINJA_OK, "exactly 100 bytes fit");
    is_int((long long)out.len, 100, "  all of them");
    kvg_jinja_output_free(&out);

    kvg_jinja_limits steps = { .max_steps = 1000, .now = NOW };
    is_int(run("{% for i in range(30) %}{% for j in range(30) %}{% endfor %}{% endfor %}", NULL, NULL,
               &steps, &out, err, sizeof err), KVG_JINJA_LIMIT, "step limit");
    ok(strstr(err, "step limit") != NULL, "  says so: %s", err);
    is_int(run("{{ range(100000000000)|length }}", NULL, NULL, &steps, &out, err, sizeof err),
           KVG_JINJA_LIMIT, "a huge range is refused before it is made");

    kvg_jinja_limits depth = { .max_depth = 20, .now = NOW };
    is_int(run("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, NULL, &depth, &out,
               err, sizeof err), KVG_JINJA_LIMIT, "macro recursion: depth limit");
    ok(strstr(err, "depth") != NULL, "  says so: %s", err);
    is_int(run("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, NULL, NULL, &out,
               err, sizeof err), KVG_JINJA_LIMIT, "macro recursion with the default limits");

    /* deeply nested data: tojson and printing stop at the depth limit */
    char *nested = malloc(20000);
    size_t k = 0;
    k += (size_t)sprintf(nested, "{\"v\": ");
    for (int i = 0; i < 1000; i++)
        nested[k++] = '[';
    for (int i = 0; i < 1000; i++)
        nested[k++] = ']';
    nested[k++] = '}';
    nested[k] = 0;
    is_int(run("{{ v|tojson }}", NULL, nested, NULL, &out, err, sizeof err), KVG_JINJA_LIMIT,
           "tojson of 1000-deep data: depth limit");
    is_int(run("{{ v }}", NULL, nested, NULL, &out, err, sizeof err), KVG_JINJA_LIMIT,
           "printing 1000-deep data: depth limit");
    free(nested);
}

static void test_api(void)
{
    char err[256];
    kvg_jinja_output out;

    /* a name in both trusted and data comes from trusted */
    is_int(run("{{ x }}", "{\"x\": \"T\"}", "{\"x\": \"D\"}", NULL, &out, err, sizeof err), 0,
           "trusted and data");
    is_str(out.text, "T", "  trusted wins");
    is_int((long long)out.n_spans, 0, "  and is not data");
    kvg_jinja_output_free(&out);
    is_int(run("", NULL, NULL, NULL, &out, err, sizeof err), 0, "empty template");
    ok(out.text && out.len == 0 && out.spans == NULL, "  empty output, no spans");
    kvg_jinja_output_free(&out);

    /* one compiled template renders many times with different data */
    kvg_jinja *t = kvg_jinja_compile("{{ a }}", 7, "t", err, sizeof err);
    json_t *d1 = js("{\"a\": 1}"), *d2 = js("{\"a\": \"two\"}");
    kvg_jinja_render(t, NULL, d1, NULL, &out, err, sizeof err);
    is_str(out.text, "1", "render 1");
    kvg_jinja_output_free(&out);
    kvg_jinja_render(t, NULL, d2, NULL, &out, err, sizeof err);
    is_str(out.text, "two", "render 2");
    kvg_jinja_output_free(&out);
    json_decref(d1);
    json_decref(d2);
    kvg_jinja_free(t);
}

/* a compiled template is immutable: threads render it at once, all alike */
struct thread_arg {
    const kvg_jinja *t;
    const json_t *data;
    const char *want;
    int bad;
};

static void *render_many(void *p)
{
    struct thread_arg *a = p;
    char err[128];

    for (int i = 0; i < 200; i++) {
        kvg_jinja_output out;
        if (kvg_jinja_render(a->t, NULL, a->data, NULL, &out, err, sizeof err) != 0 ||
            strcmp(out.text, a->want) != 0 || out.n_spans != 4)
            a->bad++;
        kvg_jinja_output_free(&out);
    }
    return NULL;
}

static void test_threads(void)
{
    static const char src[] =
        "{%- set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "<|im_start|>{{ m.role }}\n{{ m.content|trim }}<|im_end|>\n{% endfor %}{{ ns.n }}";
    char err[128];
    kvg_jinja *t = kvg_jinja_compile(src, strlen(src), "t", err, sizeof err);
    json_t *data = js("{\"messages\": [{\"role\": \"user\", \"content\": \" hi \"},"
                      " {\"role\": \"assistant\", \"content\": \"yo\"}]}");
    struct thread_arg args[4];
    pthread_t th[4];

    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){ t, data,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n2", 0 };
        pthread_create(&th[i], NULL, render_many, &args[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += args[i].bad;
    }
    is_int(bad, 0, "4 threads x 200 renders of one compiled template agree");
    json_decref(data);
    kvg_jinja_free(t);
}

int main(void)
{
    setenv("TZ", "UTC", 1);
    tzset();
    test_cases();
    test_taint();
    test_compile_errors();
    test_render_errors();
    test_limits();
    test_api();
    test_threads();
    return done_testing();
}
