#!/usr/bin/env python3
"""Prints the expected-output table of t/unit/jinja.c from Jinja2 itself (configured
as transformers' apply_chat_template, see jinja_cmp.py): run it and paste its output
over the table when cases change. Each case renders with the context CTX below
(data) and bos_token (trusted)."""
import os
import importlib.util
spec = importlib.util.spec_from_file_location("cmp", os.path.join(os.path.dirname(__file__), "jinja_cmp.py"))

CTX = {"xs": [1, 2, 3], "d": {"a": 1, "b": "x"}, "s": "hello", "n": None, "f": 2.5,
       "ws": "  pad  ", "u": "Hé日😀", "msgs": [{"role": "system", "content": "sys"},
       {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo",
       "tool_calls": [{"function": {"name": "f", "arguments": {"k": "v", "n": 1}}}]}]}
TRUSTED = {"bos_token": "<s>"}

CASES = [
    # literals and printing
    "{{ 'a' }}{{ \"b\" }}{{ 'it''s' }}", "{{ 'a\\tb\\n\\x41\\u00e9' }}", "{{ 42 }}|{{ -7 }}|{{ 1_000 }}",
    "{{ 1.0 }}|{{ 0.1 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ 2.5e-7 }}|{{ 1/3 }}",
    "{{ true }}{{ True }}{{ false }}{{ none }}{{ None }}",
    "{{ [1, 'a', none, true, 1.5] }}", "{{ {'a': 1, 'b': [2]} }}", "{{ (1,) }}{{ (1, 2) }}{{ () }}",
    "{{ ['it\\'s', \"q\\\"q\", 'x\\ny', '\\x01'] }}", "{{ d }}|{{ xs }}|{{ msgs[2].tool_calls }}",
    "{{ undefined_var }}|{{ n }}", "{{ 1, 2 }}",
    # arithmetic
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}",
    "{{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
    "{{ 'ab' * 3 }}{{ [1] * 2 }}{{ 'a' + 'b' }}{{ [1] + [2] }}{{ 1 + 2.5 }}{{ true + 1 }}",
    "{{ 'a' ~ 1 ~ none ~ [1] }}", "{{ 9223372036854775807 }}",
    # comparisons and logic
    "{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 1 == 1.0 }}{{ 'a' != 'b' }}{{ [1,2] == [1,2] }}{{ (1,2) == [1,2] }}",
    "{{ 'a' < 'b' }}{{ [1,2] < [1,3] }}{{ 'ell' in s }}{{ 2 in xs }}{{ 'a' in d }}{{ 'z' not in d }}",
    "{{ 0 or 'x' }}|{{ 1 and 'y' }}|{{ '' and 1 }}|{{ none or 0 }}|{{ not 0 }}|{{ not xs }}",
    "{{ 'y' if xs else 'n' }}|{{ 'y' if [] else 'n' }}|{{ 'y' if false }}|",
    # subscripts, attributes, slices
    "{{ xs[0] }}{{ xs[-1] }}{{ xs.1 }}{{ d.a }}{{ d['b'] }}{{ s[1] }}{{ s[-1] }}{{ xs[5] }}|{{ d.zz }}",
    "{{ s[1:3] }}|{{ s[::-1] }}|{{ s[::2] }}|{{ xs[::-1] }}|{{ xs[1:] }}|{{ xs[:-1] }}|{{ s[10:] }}|{{ xs[-2::-1] }}",
    "{{ u|length }}|{{ u[1] }}|{{ u[-1] }}|{{ u[1:3] }}|{{ u[::-1] }}|{{ u|upper }}",
    "{{ msgs[0].role }}{{ msgs[0]['content'] }}{{ msgs[2].tool_calls[0].function.arguments.k }}",
    "{{ d.items() }}", "{{ d.keys()|list }}{{ d.values()|list }}{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 5) }}",
    # statements
    "{% if 0 %}a{% elif 1 %}b{% else %}c{% endif %}", "{% for x in xs %}{{ x }}{% else %}E{% endfor %}",
    "{% for x in [] %}{{ x }}{% else %}E{% endfor %}",
    "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('a', 'b') }};{% endfor %}",
    "{% for x in xs if x != 2 %}{{ x }}{{ loop.length }}{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
    "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}",
    "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in xs %}{% set y = x %}{% endfor %}{{ y }}|{% set ns = namespace(t=0) %}{% for x in xs %}{% set ns.t = ns.t + x %}{% endfor %}{{ ns.t }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = [3, 4] %}{% set e, f = c %}{{ e }}{{ f }}",
    "{% set x %}in {{ s }}{% endset %}[{{ x }}]{% set y | upper %}up{% endset %}{{ y }}",
    "{% macro m(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }} {{ m(b=4, a=5) }}",
    "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, z=3) }}",
    "{% macro outer() %}[{{ caller('x') }}]{% endmacro %}{% call(v) outer() %}c{{ v }}{% endcall %}",
    "{% macro rec(n) %}{{ n }}{% if n > 0 %}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}",
    "{% set g = 1 %}{% macro m() %}{{ g }}{% endmacro %}{% set g = 2 %}{{ m() }}",
    "{% filter upper %}ab{{ s }}{% endfilter %}", "{% raw %}{{ x }}{% endraw %}", "{# c #}a{# d #}",
    "{% generation %}gen{{ 1 }}{% endgeneration %}",
    "{% set a = 5 %}{% with a = 1, b = a %}{{ a }}{{ b }}{% endwith %}{{ a }}{% with %}{% set q = 1 %}{{ q }}{% endwith %}{{ q }}",
    # whitespace control
    "a  {%- if 1 %}  b  {% endif -%}  c", "a\n  {% if 1 %}\n  b\n  {% endif %}\nc", "a {{- ' b ' -}} c",
    "x\n    {%+ if 1 %}y{% endif +%}\nz", "  {# c #}\nx", "a {#- c -#} b", "<{{ 1 }}>\n",
    "line\r\nnext\rlast\n\n", "{% if 1 %}\n\n{% endif %}",
    # filters
    "{{ ws|trim }}|{{ 'xxaxx'|trim('x') }}|{{ none|trim }}|{{ ws|length }}|{{ xs|count }}|{{ d|length }}",
    "{{ s|upper }}{{ 'ABC'|lower }}{{ 'hello world-x (y)'|title }}{{ 'hELLO'|capitalize }}",
    "{{ s|replace('l', 'L') }}|{{ s|replace('l', 'L', 1) }}|{{ 'ab'|replace('', '-') }}",
    "{{ xs|join(',') }}|{{ xs|join }}|{{ msgs|join('/', attribute='role') }}",
    "{{ xs|first }}{{ xs|last }}{{ []|first }}|{{ s|first }}|{{ xs|list }}{{ s|list }}{{ d|list }}",
    "{{ d|items|list }}|{{ {'b': 1, 'A': 2, 'a': 3}|dictsort }}|{{ {'b': 1, 'a': 2}|dictsort(by='value', reverse=true) }}",
    "{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}|{{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='role')|join(',') }}",
    "{{ xs|select('odd')|list }}{{ xs|reject('odd')|list }}{{ [0, 1, '', 'a']|select|list }}{{ xs|map('string')|join('-') }}",
    "{{ msgs|map(attribute='zz', default='D')|list }}|{{ msgs|selectattr('tool_calls', 'defined')|list|length }}",
    "{{ n|default('x') }}|{{ zz|default('y') }}|{{ ''|default('z', true) }}|{{ zz|d('w') }}",
    "{{ '12'|int + 1 }}|{{ 3.9|int }}|{{ 'x'|int }}|{{ 'x'|int(7) }}|{{ '3.5'|int }}|{{ '2'|float }}|{{ 'a'|float }}",
    "{{ 12|string ~ 'x' }}|{{ xs|string }}|{{ -3|abs }}|{{ 2.5|round }}|{{ 3.14159|round(2) }}|{{ 2.7|round(0, 'floor') }}",
    "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(1, blank=true) }}|{{ 'a\\nb'|indent('> ') }}",
    "{{ [3, 1, 2]|sort }}|{{ ['b', 'A', 'c']|sort }}|{{ [3, 1]|sort(reverse=true) }}|{{ msgs|sort(attribute='role')|map(attribute='role')|join(',') }}",
    "{{ [1, 2, 1, 3]|unique|list }}|{{ ['a', 'A']|unique|list }}|{{ xs|min }}{{ xs|max }}{{ xs|sum }}{{ ['b', 'A']|max }}|{{ [1.5, 2]|sum }}",
    "{{ xs|reverse|list }}|{{ s|reverse }}|{{ 'a b  c'|wordcount }}|{{ '%s=%d %05.1f %r %%'|format('k', 3, 2.25, 'q') }}",
    "{{ 'x'|center(5) }}|{{ 'hello world foo'|truncate(9) }}|{{ xs|batch(2)|list }}|{{ '<a&\"b\\'>'|escape }}|{{ s|safe }}",
    "{{ xs|tojson }}|{{ d|tojson }}|{{ msgs[2]|tojson }}|{{ 'é\"\\n\\u0001'|tojson }}|{{ 1.0|tojson }}|{{ none|tojson }}",
    "{{ d|tojson(indent=2) }}|{{ []|tojson(indent=2) }}|{{ {'b': 1, 'a': [1, {}]}|tojson(sort_keys=true, indent=1) }}",
    "{{ d|tojson(separators=(',', ':')) }}|{{ 'é😀'|tojson(ensure_ascii=true) }}|{{ {1: 2, true: 3}|tojson }}",
    # tests
    "{{ zz is defined }}{{ s is defined }}{{ zz is undefined }}{{ n is none }}{{ s is string }}{{ 1 is number }}{{ 1.5 is float }}{{ 1 is integer }}{{ true is integer }}",
    "{{ true is boolean }}{{ d is mapping }}{{ xs is iterable }}{{ s is iterable }}{{ 1 is iterable }}{{ xs is sequence }}{{ d is sequence }}{{ true is true }}{{ 0 is false }}",
    "{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 1 is equalto 1 }}{{ 2 is eq 3 }}{{ 2 is in xs }}{{ 'ab' is lower }}{{ 'AB' is upper }}",
    "{{ none is sameas none }}{{ xs is sameas xs }}{{ range is callable }}{{ s is not string }}{{ s is not none }}{{ 2 is gt 1 }}{{ 2 is le 1 }}",
    # methods
    "{{ ws.strip() }}|{{ ws.lstrip() }}|{{ ws.rstrip() }}|{{ 'xyax'.strip('xy') }}|{{ '\\n\\na\\n'.lstrip('\\n') }}",
    "{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ' a b '.rsplit(None, 1) }}",
    "{{ s.startswith('he') }}{{ s.endswith(('x', 'lo')) }}{{ s.upper() }}{{ s.title() }}{{ s.capitalize() }}{{ 'Hello'.swapcase() }}",
    "{{ s.replace('l', '') }}{{ s.find('l') }}{{ s.rfind('l') }}{{ s.find('z') }}{{ s.index('e') }}{{ s.count('l') }}{{ '-'.join(['a', 'b']) }}",
    "{{ '{}-{}'.format(1, 'b') }}|{{ '{0}{x}'.format(1, x=2) }}|{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}{{ 'Ab'.isupper() }}",
    "{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ 'ab'.zfill(4) }}|{{ 'a=b'.partition('=') }}|{{ 'pre_x'.removeprefix('pre_') }}",
    "{{ xs.index(2) }}{{ [1, 1, 2].count(1) }}{{ msgs[0].get('role') }}{{ msgs[0].items()|list|length }}",
    # globals
    "{{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ range(3, 0, -1)|list }}{{ dict(a=1) }}{{ namespace(x=1).x }}",
    "{{ strftime_now('%Y-%m-%d') }}",
    # Jinja2 errors and raises (expected: ERROR / RAISED)
    "{{ raise_exception('boom') }}", "{{ zz.attr }}", "{{ 1 + 'a' }}", "{{ 1 / 0 }}", "{{ xs.append(4) }}",
    "{{ s.nosuch() }}", "{{ n|length }}", "{{ zz|tojson }}", "{{ 9223372036854775807 + 1 }}",
    "{{ xs|map('upper')|length }}", "{% for a, b in xs %}{% endfor %}", "{{ 1 < 'a' }}",
    "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}",
    # found by random differential testing
    "{{ 15|round(-1) }}{{ 25|round(-1) }}{{ 3|round(2) }}{{ [none, zz] }}", "{{ [] in d }}",
    "{{ []|last|int }}", "{{ f|indent(2) }}", "{{ ' a b c '.split(None, 1) }}{{ ' a b c '.rsplit(None, 1) }}",
    "{{ none|selectattr('x')|list }}{{ none|map('upper')|list }}", "{{ 'a'|safe + '<b>' }}{{ '<'|escape ~ '<' }}",
    "a\n  {% raw %}\n  x\n  {% endraw %}\nb",
    "{{ [0, 1, 2]|reject|list }}{{ [0, 1]|select|list }}",
    "{{ '%s-%d' % ('a', 3) }}{{ 'A b' % d }}{{ '%s' % xs }}{{ '%5.1f%%' % 2.25 }}", "{{ 'x' % 1 }}",
    "{{ d|attr('a') }}|{{ s|attr('upper') is callable }}|{{ xs|attr('append') }}|{{ xs.append }}", "{{ xs['append'](1) }}",
]

# where kvg_jinja fails on purpose while Python succeeds (64-bit integers)
OURS_ERROR = {"{{ 9223372036854775807 + 1 }}"}

def ctype(src):
    out = '"'
    for ch in src.encode():
        c = chr(ch)
        if c == '"': out += '\\"'
        elif c == '\\': out += '\\\\'
        elif c == '\n': out += '\\n'
        elif c == '\r': out += '\\r'
        elif c == '\t': out += '\\t'
        elif ch < 0x20 or ch >= 0x7f: out += '\\%03o' % ch
        else: out += c
    return out + '"'

def main():
    cmp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cmp)
    for src in CASES:
        kind, text = cmp.ref(src, TRUSTED, CTX)
        if src in OURS_ERROR:
            print("    /* Python's ints grow; ours stop at 64 bits with an error (on purpose) */")
            print("    { %s, ERROR }," % ctype(src))
        elif kind == "ok":
            print("    { %s,\n      %s }," % (ctype(src), ctype(text)))
        else:
            print("    { %s, %s }," % (ctype(src), "RAISED" if kind == "raised" else "ERROR"))

main()
