#!/usr/bin/env python3
"""Expected chat-template renderings from Python's jinja2, configured exactly as
Hugging Face transformers' apply_chat_template configures it
(transformers/utils/chat_template_utils.py: _compile_jinja_template):

  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[AssistantTracker, jinja2.ext.loopcontrols])
  filters["tojson"]  = json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...)
  globals["raise_exception"] raises jinja2.exceptions.TemplateError(message)
  globals["strftime_now"](fmt) = datetime.now().strftime(fmt)   (fixed here to FIXED_NOW)

and rendered with messages, tools (None when absent), documents (None when
absent), add_generation_prompt and the special tokens, like
tokenizer.apply_chat_template does.

Writes two fixtures to tests/fixtures/chat_templates/:
  language.json  small templates exercising the language (whitespace control,
                 loops, scoping, macros, filters, tests, errors)
  models.json    every template in ../shared/data/chat-templates, the Llama 3 and
                 Qwen 3 templates of ../shared/data/hf-tokenizers, the newer
                 templates in tests/fixtures/chat_templates/extra and Gemma 3's
                 built-in template, over a set of conversations

Each case holds the expected output, or the error: {"type": <Python exception
class>, "message": str(exception)}.

Usage: python3 tools/gen_chat_template_fixtures.py   (jinja2 3.1.x)
"""

import datetime
import hashlib
import json
import os
import random
import re
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "chat_templates")
FIXED_NOW = datetime.datetime(2024, 7, 26, 13, 5, 9)


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} tag, rendering its body in place."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def render(source, context):
    try:
        template = ENV.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"error": {"type": "TemplateSyntaxError", "message": e.message, "line": e.lineno}}
    except jinja2.exceptions.TemplateAssertionError as e:
        return {"error": {"type": "TemplateSyntaxError", "message": e.message, "line": e.lineno}}
    except SyntaxError as e:  # e.g. {% break %} outside a loop fails in Python's compile()
        return {"error": {"type": "TemplateSyntaxError", "message": e.msg, "line": None}}
    try:
        return {"expected": template.render(**context)}
    except Exception as e:  # the C++ side maps these by class name
        return {"error": {"type": type(e).__name__, "message": str(e)}}


# ---------------------------------------------------------------------------
# language cases: (name, template, context)

def language_cases():
    cases = []

    def add(name, template, **ctx):
        cases.append((name, template, ctx))

    # --- whitespace control, trim_blocks / lstrip_blocks ---------------------
    opens = ["{%", "{%-", "{%+"]
    closes = ["%}", "-%}", "+%}"]
    n = 0
    for o in opens:
        for c in closes:
            for pre, post in [("a  \n  ", "\n  b"), ("a", "b"), ("\n\t \t", " \n\n"), ("x\n", "\ny")]:
                add(f"ws_block_{n}", f"{pre}{o} if true {c}{post}{o} endif {c}{pre}", )
                n += 1
    for o in ["{{", "{{-", "{{+"]:
        for c in ["}}", "-}}"]:
            for pre, post in [("a  \n  ", "\n  b"), ("\n\t", "\t\n")]:
                add(f"ws_var_{n}", f"{pre}{o} 'v' {c}{post}")
                n += 1
    for o in ["{#", "{#-", "{#+"]:
        for c in ["#}", "-#}", "+#}"]:
            add(f"ws_comment_{n}", f"a  \n  {o} note {c}\n  b")
            n += 1
    add("ws_loop_lines", "<ul>\n  {% for i in [1, 2] %}\n    <li>{{ i }}</li>\n  {% endfor %}\n</ul>\n")
    add("ws_trailing_newline_dropped", "line\n")
    add("ws_two_trailing_newlines", "line\n\n")
    add("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n")
    add("ws_cr_only", "a\r{{ 1 }}\rb")
    add("ws_lstrip_not_after_text", "x {% if true %}y{% endif %}")
    add("ws_lstrip_at_start", "   {% if true %}y{% endif %}")
    add("ws_lstrip_tabs", "a\n\t \t{% if true %}\nb\n\t{% endif %}\nc")
    add("ws_lstrip_unicode_space", "a\n\u3000{% if true %}b{% endif %}")
    add("ws_var_not_lstripped", "a\n    {{ 'v' }}\nb")
    add("ws_minus_strips_newlines", "a\n\n  {%- if true -%}\n\n  b  \n\n {%- endif -%}\n\n c")
    add("ws_raw", "{% raw %}\n  {{ not evaluated }} {% if %}\n{% endraw %}\nafter")
    add("ws_raw_minus", "a  {%- raw -%}  {{ x }}  {%- endraw -%}  b")
    add("ws_raw_lstrip", "a\n    {% raw %}x{% endraw %}\n    {% raw %}y\n    {% endraw %}\nz")
    add("ws_comment_multiline", "a{# line1\nline2 #}b\n{# c #}\nd")
    add("ws_nested_braces_in_var", "{{ {'a': {'b': 1}} }}")
    add("ws_data_braces", "{ not a tag } {x} {")
    add("ws_set_block", "{% set x %}\n  hello\n{% endset %}[{{ x }}]")
    add("ws_macro_body", "{% macro m(a) %}\n  [{{ a }}]\n{% endmacro %}\n{{ m(1) }}{{ m(2) }}")
    add("ws_plus_keeps", "a\n    {%+ if true +%}\nb\n    {%+ endif +%}\nc")

    # --- literals and operators ---------------------------------------------
    add("lit_strings", r"""{{ 'a\'b' }}|{{ "c\"d" }}|{{ 'tab\there' }}|{{ 'nl\nx' }}|{{ '\x41\u00e9\U0001F600' }}|{{ '\101' }}|{{ 'a' 'b' "c" }}|{{ '\q' }}""")
    add("lit_numbers", "{{ 1 }} {{ -2 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1.5 }} {{ 1e3 }} {{ 2.5E-3 }} {{ 1_0.5 }}")
    add("lit_consts", "{{ true }} {{ True }} {{ false }} {{ False }} {{ none }} {{ None }}")
    add("lit_containers", "{{ [1, 'a', none, true, 1.0, [2], {'k': 'v'}] }} {{ (1,) }} {{ (1, 2) }} {{ () }} {{ {} }} {{ [] }}")
    add("lit_dict_order", "{{ {'b': 1, 'a': 2, 'b': 3} }}")
    add("lit_tuple_print", "{{ 1, 2 }}")
    add("lit_trailing_comma", "{{ [1, 2,] }}{{ {'a': 1,} }}{{ (1, 2,) }}")
    add("float_repr", "{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-4 }} {{ 1e-5 }} {{ 1/3 }} {{ 10/2 }} {{ -0.0 }} {{ 123456789.123456789 }} {{ 1e100 }} {{ 2**0.5 }}")
    add("arith_int", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}")
    add("arith_float", "{{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }} {{ -7.5 % 2 }} {{ 1.5 * 2 }} {{ 3 - 0.5 }}")
    add("arith_bool", "{{ true + 1 }} {{ true * 3 }} {{ false - 1 }}")
    add("arith_precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ '1' + 2 ~ 3 }} {{ 10 - 2 - 3 }} {{ 2 * 3 ~ 4 * 5 }}")
    add("arith_unary", "{{ -x }} {{ +x }} {{ - -3 }} {{ -x|abs }}", x=5)
    add("str_ops", "{{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ 'a' ~ 1 ~ none ~ true ~ [1] }} {{ [1] + [2] }} {{ (1,) + (2,) }} {{ [0] * 3 }}")
    add("str_percent", "{{ '%s-%d-%05.2f-%x-%r-%%' % ('a', 42, 3.14159, 255, 'q') }}|{{ '%(a)s=%(b)d' % {'a': 'k', 'b': 2} }}|{{ '%s' % [1] }}|{{ '%5s|%-5s|%+d' % ('ab', 'cd', 3) }}")
    add("compare_ops", "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 2 >= 2 }} {{ 2 <= 1 }} {{ none == none }} {{ 'a' == 'a' }} {{ [1] == [1] }} {{ {'a': 1} == {'a': 1} }} {{ (1,) == [1] }}")
    add("logic_ops", "{{ true and 'x' }} {{ 0 and 'x' }} {{ '' or 'y' }} {{ 'z' or 'y' }} {{ not 0 }} {{ not 'a' }} {{ none or [] or 'last' }}")
    add("in_ops", "{{ 'a' in 'cat' }} {{ 'x' not in 'cat' }} {{ 1 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in (1, 2) }} {{ 'ab' in ['ab'] }}")
    add("cond_expr", "{{ 'y' if true else 'n' }} {{ 'y' if false else 'n' }} {{ 'y' if false }}| {{ 1 if false else 2 if true else 3 }}")
    add("not_precedence", "{{ not 1 == 2 }} {{ not x is defined }} {{ (not true) == false }}")
    add("undefined_ops", "[{{ x }}] {{ x is defined }} {{ x is undefined }} {{ x == none }} {{ x|default('d') }} {{ x ~ 'a' }} {{ x|length }} {% for i in x %}no{% endfor %}{{ 'a' in x }} {% if x %}t{% else %}f{% endif %}")
    add("undefined_attr_chain_ok", "{{ d.missing is defined }} {{ d['missing'] is defined }} {{ none.x is defined }} {{ 'abc'.foo is defined }}", d={"a": 1})

    # --- attribute / item access --------------------------------------------
    add("access_dict", "{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ d['b']['c'] }} {{ d.get('a') }} {{ d.get('zz', 'dflt') }} {{ d.get('zz') }}", d={"a": 1, "b": {"c": "x"}})
    add("access_dict_method_shadow", "{{ d['items'] }} {{ d.items() | list }}", d={"items": "key", "x": 1})
    add("access_list", "{{ l[0] }} {{ l[-1] }} {{ l.0 }} {{ l[1:] }} {{ l[:-1] }} {{ l[::2] }} {{ l[::-1] }} {{ l[5:] }} {{ l[-100:1] }}", l=[1, 2, 3, 4])
    add("access_str", "{{ s[0] }} {{ s[-1] }} {{ s[1:3] }} {{ s[::-1] }} {{ s|length }}", s="héllo🌍")
    add("access_missing", "[{{ l[10] }}][{{ d.zz }}][{{ d['zz'] }}][{{ d[0] }}][{{ none.x }}][{{ 'ab'[9] }}]", l=[1], d={"a": 1})
    add("access_loop_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for v in d.values() %}{{ v }}{% endfor %}{{ d.keys()|list }}", d={"z": 1, "a": 2})
    add("access_nested_json", "{{ m.tool_calls[0].function.arguments.city }} {{ m['tool_calls'][0]['function']['name'] }}", m={"tool_calls": [{"function": {"name": "f", "arguments": {"city": "Paris"}}}]})
    add("access_range", "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ range(3)[1] }} {{ range(0)|list }}")

    # --- statements -----------------------------------------------------------
    add("if_elif_else", "{% for x in [1, 2, 3, 4] %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three{% else %}other{% endif %} {% endfor %}")
    add("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}[{{ loop.previtem }}|{{ loop.nextitem }}] {% endfor %}")
    add("for_loop_cycle_changed", "{% for x in [1, 1, 2, 3, 3] %}{{ loop.cycle('a', 'b', 'c') }}{{ loop.changed(x) }} {% endfor %}")
    add("for_nested_depth", "{% for x in [1, 2] %}{% for y in [3, 4] %}{{ loop.depth }}{{ loop.index }}{{ x }}{{ y }} {% endfor %}{{ loop.depth0 }}|{% endfor %}")
    add("for_else", "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|{% for x in [1] %}{{ x }}{% else %}empty{% endfor %}")
    add("for_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ loop.index }}{{ loop.last }} {% endfor %}")
    add("for_unpack", "{% for a, b in [(1, 2), [3, 4], 'xy'] %}{{ a }}{{ b }} {% endfor %}")
    add("for_break_continue", "{% for x in range(10) %}{% if x is even %}{% continue %}{% endif %}{% if x > 6 %}{% break %}{% endif %}{{ x }}{% endfor %}")
    add("for_recursive", "{% for n in tree recursive %}[{{ n.name }}{% if n.children %}:{{ loop(n.children) }}{% endif %}@{{ loop.depth }}]{% endfor %}",
        tree=[{"name": "a", "children": [{"name": "b", "children": []}, {"name": "c", "children": [{"name": "d"}]}]}, {"name": "e"}])
    add("for_over_dict_and_string", "{% for c in 'hé!' %}{{ c }}.{% endfor %}{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}")
    add("scope_loop_set", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }};{% endfor %}{{ x }}")
    add("scope_loop_iteration_fresh", "{% for i in [1, 2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}[{{ y }}]")
    add("scope_if_leaks", "{% if true %}{% set z = 5 %}{% endif %}{{ z }}")
    add("scope_macro_lexical", "{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}{% for x in [7] %}{{ m() }}{% endfor %}")
    add("scope_macro_in_loop", "{% for i in [1] %}{% set x = 3 %}{% macro m() %}{{ x }}{{ i }}{% endmacro %}{{ m() }}{% endfor %}")
    add("scope_with", "{% with a = 1, b = 2 %}{% set c = 3 %}{{ a }}{{ b }}{{ c }}{% endwith %}[{{ a }}{{ c }}]")
    add("scope_set_block", "{% set x %}{% set q = 1 %}body{% endset %}{{ x }}[{{ q }}]")
    add("scope_filter_block", "{% filter upper %}{% set q = 1 %}abc{{ q }}{% endfilter %}[{{ q }}]")
    add("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}")
    add("set_override_context", "{% set messages = messages[1:] %}{{ messages|length }}", messages=[1, 2, 3])
    add("set_block_filter", "{% set x | trim | upper %}\n  hello  \n{% endset %}[{{ x }}]")
    add("namespace_basic", "{% set ns = namespace(a=1, b='x') %}{% for i in [1, 2, 3] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}{{ ns.missing }}|{{ ns }}")
    add("namespace_from_dict", "{% set ns = namespace({'k': 1}, j=2) %}{{ ns.k }}{{ ns.j }}{{ ns['k'] }}")
    add("namespace_list_accumulate", "{% set ns = namespace(items=[]) %}{% for i in range(3) %}{% set ns.items = ns.items + [i * i] %}{% endfor %}{{ ns.items }}")
    add("macro_defaults", "{% macro m(a, b=a ~ '!', c='z') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, c=3) }}|{{ m(1, 2, 3) }}|{{ m(a=4) }}|{{ m() }}")
    add("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}")
    add("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(10) }}")
    add("macro_caller", "{% macro box(title) %}[{{ title }}:{{ caller() }}]{% endmacro %}{% call box('t') %}inner {{ 1 + 1 }}{% endcall %}")
    add("macro_caller_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}<{{ x }}>{% endcall %}")
    add("macro_returns_string", "{% macro m() %}42{% endmacro %}{{ m() + '!' }}{{ m()|int + 1 }}{{ m() is string }}")
    add("macro_print", "{% macro m() %}{% endmacro %}{{ m }}")
    add("filter_block", "{% filter trim %}\n   spaced   \n{% endfilter %}|{% filter upper|replace('A', '4') %}abc{% endfilter %}")
    add("print_stmt", "{% print 'a', 1 %}{% print x %}", x="q")
    add("generation_tag", "{% for m in msgs %}{% generation %}{{ m }};{% endgeneration %}{% endfor %}", msgs=["a", "b"])

    # --- filters ----------------------------------------------------------------
    add("f_trim", "[{{ '  a b  '|trim }}][{{ 'xxaxx'|trim('x') }}][{{ '\u3000\u00a0x\n'|trim }}][{{ 5|trim }}]")
    add("f_length", "{{ 'héllo'|length }} {{ [1, 2]|length }} {{ {'a': 1}|length }} {{ 'abc'|count }} {{ range(7)|length }}")
    add("f_tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ 'é\u2028\u0001'|tojson }}|{{ 'é😀'|tojson(true) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}|{{ d|tojson(indent='\t') }}|{{ {'a': []}|tojson(indent=0) }}",
        d={"b": [1, 2.5, None, True], "a": {"x": "y\"\\\n"}, "c": {}, "e": []})
    add("f_tojson_keys", "{{ {1: 'a', none: 'b', true: 'c', 2.5: 'd'}|tojson }}|{{ (1, 'x')|tojson }}|{{ 1e20|tojson }}|{{ 1.0|tojson }}")
    add("f_items_list_join", "{{ d|items|list }}|{{ 'abc'|list }}|{{ [1, 2, 3]|join(', ') }}|{{ [1, 'a', none]|join }}|{{ users|join(', ', attribute='name') }}",
        d={"x": 1, "y": [2]}, users=[{"name": "ann"}, {"name": "bob"}])
    add("f_default", "{{ x|default('d') }}|{{ none|default('d') }}|{{ ''|default('d') }}|{{ ''|default('d', true) }}|{{ 0|d('zero', boolean=true) }}|{{ false|default }}|{{ x|d }}")
    add("f_first_last", "{{ [1, 2]|first }}{{ [1, 2]|last }}{{ 'ab'|first }}{{ 'ab'|last }}{{ {'k': 1, 'j': 2}|first }}{{ {'k': 1, 'j': 2}|last }}[{{ []|first }}][{{ []|last }}]")
    add("f_case", "{{ 'hÉllo wOrld'|lower }}|{{ 'hÉllo wOrld'|upper }}|{{ 'hello world-foo (bar) it\\'s'|title }}|{{ 'hÉllo WORLD'|capitalize }}|{{ 'straße'|upper }}|{{ 'ΣΑΣ ΑΣ'|lower }}")
    add("f_replace", "{{ 'aaa'|replace('a', 'b') }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'abc'|replace('', '-') }}|{{ 123|replace('2', 'x') }}")
    add("f_string_int_float", "{{ 1|string }}{{ [1]|string }}{{ none|string }}|{{ '42'|int }} {{ '3.9'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ '0x1A'|int(0, 16) }} {{ '  12 '|int }} {{ 3.9|int }} {{ true|int }} {{ '1_000'|int }}|{{ '3.5'|float }} {{ 'x'|float }} {{ 2|float }} {{ '1e3'|float }} {{ ' -inf '|float }}")
    add("f_abs_round", "{{ -3|abs }} {{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 42.55|round(1, 'floor') }} {{ 42.51|round(1, 'ceil') }} {{ 3|round }} {{ 1234|round(-2) }} {{ 0.125|round(2) }}")
    add("f_indent", "[{{ 'a\\nb\\n\\nc'|indent }}][{{ 'a\\nb'|indent(2, true) }}][{{ 'a\\n\\nb\\n'|indent(2, blank=true) }}][{{ 'a\\nb'|indent('>> ', first=true) }}][{{ 'x'|indent }}]")
    add("f_escape_safe", "{{ '<a href=\"x\">&\\'</a>'|e }}|{{ '<b>'|safe }}|{{ '<b>'|escape|escape }}|{{ ('<'|safe + '<') }}|{{ ('<' + '<'|safe) }}|{{ '<'|forceescape }}|{{ ('x'|safe) is escaped }}")
    add("f_unique", "{{ [1, 2, 2, 'a', 'A', 'b']|unique|list }}|{{ ['a', 'A']|unique(case_sensitive=true)|list }}|{{ users|unique(attribute='g')|map(attribute='n')|list }}",
        users=[{"n": 1, "g": "x"}, {"n": 2, "g": "y"}, {"n": 3, "g": "x"}])
    add("f_map", "{{ users|map(attribute='name')|list }}|{{ users|map(attribute='age', default=0)|list }}|{{ ['a', 'B']|map('upper')|list }}|{{ [1, 2]|map('string')|join('-') }}|{{ users|map(attribute='tags.0')|list }}",
        users=[{"name": "ann", "age": 3, "tags": ["t1"]}, {"name": "bob", "tags": ["t2"]}])
    add("f_select_reject", "{{ [1, 2, 3, 4, 5]|select('odd')|list }}|{{ [1, 2, 3]|reject('odd')|list }}|{{ [0, 1, '', 'a', none]|select|list }}|{{ [1, 2, 3]|select('divisibleby', 3)|list }}|{{ [1, 5, 9]|select('>', 4)|list }}|{{ ['a', 'b']|reject('equalto', 'a')|list }}|{{ [1, 2, 3]|select('in', [2, 3])|list }}")
    add("f_selectattr", "{{ tools|selectattr('type', 'equalto', 'function')|map(attribute='name')|list }}|{{ tools|rejectattr('type', 'equalto', 'function')|list|length }}|{{ tools|selectattr('enabled')|map(attribute='name')|join }}|{{ tools|selectattr('type', 'defined')|list|length }}",
        tools=[{"type": "function", "name": "a", "enabled": True}, {"type": "code_interpreter", "name": "b"}, {"name": "c", "enabled": False}])
    add("f_sort", "{{ [3, 1, 2]|sort }}{{ [3, 1, 2]|sort(reverse=true) }}{{ ['b', 'A', 'a', 'C']|sort }}{{ ['b', 'A', 'a', 'C']|sort(case_sensitive=true) }}{{ users|sort(attribute='age')|map(attribute='n')|list }}{{ users|sort(attribute='age,n', reverse=true)|map(attribute='n')|list }}",
        users=[{"n": "x", "age": 3}, {"n": "y", "age": 1}, {"n": "z", "age": 3}])
    add("f_reverse_sum_minmax", "{{ 'abc'|reverse }}{{ [1, 2, 3]|reverse|list }}{{ [1, 2, 3]|sum }}{{ [1.5, 2]|sum }}{{ items|sum(attribute='v') }}{{ [1, 2]|sum(start=10) }}{{ [3, 9, 2]|max }}{{ [3, 9, 2]|min }}{{ ['a', 'B']|max }}{{ ['a', 'B']|max(case_sensitive=true) }}{{ items|max(attribute='v') }}[{{ []|max }}]",
        items=[{"v": 1}, {"v": 5}])
    add("f_batch_slice", "{{ [1, 2, 3, 4, 5]|batch(2)|list }}{{ [1, 2, 3]|batch(2, 'x')|list }}{{ [1, 2, 3, 4, 5]|slice(2)|list }}{{ [1, 2, 3]|slice(2, 0)|list }}")
    add("f_misc", "{{ 'hello big world'|wordcount }}|{{ 'ab'|center(6) }}|{{ 'foo bar baz qux'|truncate(9) }}|{{ 'foo bar baz qux'|truncate(9, true) }}|{{ 'foo bar baz'|truncate(11) }}|{{ {'b': 1, 'a': 2}|dictsort }}|{{ {'b': 1, 'a': 2}|dictsort(by='value') }}|{{ '%s=%s'|format('a', 1) }}|{{ d|attr('a') }}{{ d|attr('get') is defined }}",
        d={"a": 1})
    add("f_chain", "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|map('trim')|map('upper')|join(' / ') }}",
        messages=[{"role": "user", "content": " hi "}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "bye\n"}])

    # --- tests --------------------------------------------------------------------
    add("tests_types", "{{ 1 is number }}{{ 1.0 is number }}{{ true is number }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is mapping }}{{ [] is sequence }}{{ 'a' is sequence }}{{ {} is sequence }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ none is none }}{{ false is boolean }}{{ 0 is boolean }}")
    add("tests_values", "{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 'aB' is lower }}{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 2 is gt 1 }}{{ 2 is ge 3 }}{{ 1 is lt 2 }}{{ 1 is le 1 }}{{ 1 is ne 1 }}{{ 2 is in [1, 2] }}{{ none is sameas none }}{{ 'upper' is filter }}{{ 'odd' is test }}{{ 'nope' is filter }}")
    add("tests_not", "{{ x is not defined }}{{ 1 is not string }}{{ none is not none }}{{ [1] is not mapping }}")
    add("tests_content_kinds", "{% for m in msgs %}{% if m.content is string %}S{% elif m.content is iterable %}I{% elif m.content is none %}N{% else %}?{% endif %}{% endfor %}",
        msgs=[{"content": "x"}, {"content": [{"type": "text", "text": "a"}]}, {"content": None}, {"content": 5}])
    add("tests_callable", "{{ range is callable }}{{ 1 is callable }}{{ 'a'.upper is callable }}{{ x is callable }}")

    # --- methods -------------------------------------------------------------------
    add("m_str_strip_split", "[{{ ' a '.strip() }}][{{ 'xxaxx'.lstrip('x') }}][{{ 'xxaxx'.rstrip('x') }}][{{ ' a\\n'.rstrip() }}]{{ 'a b  c'.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ '  a  b  '.split(None, 1) }}{{ 'l1\\nl2\\r\\nl3'.splitlines() }}")
    add("m_str_case", "{{ 'aBc'.upper() }}{{ 'aBc'.lower() }}{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}{{ 'aBc'.swapcase() }}{{ \"it's\".title() }}")
    add("m_str_search", "{{ 'hello'.startswith('he') }}{{ 'hello'.endswith('lo') }}{{ 'hello'.startswith(('x', 'h')) }}{{ 'hello'.find('l') }}{{ 'hello'.rfind('l') }}{{ 'hello'.find('z') }}{{ 'hello'.index('e') }}{{ 'hello'.count('l') }}{{ 'héllo'.find('l') }}{{ 'hello'.startswith('l', 2) }}{{ ''.find('') }}{{ 'ab'.find('', 5) }}")
    add("m_str_misc", "{{ 'a-b-c'.replace('-', '+') }}{{ 'a-b-c'.replace('-', '+', 1) }}{{ ', '.join(['x', 'y']) }}{{ 'ab'.center(6, '*') }}{{ 'ab'.ljust(4, '.') }}{{ 'ab'.rjust(4) }}{{ '42'.zfill(5) }}{{ 'a=b=c'.partition('=') }}{{ 'a=b=c'.rpartition('=') }}{{ 'prefix_x'.removeprefix('prefix_') }}{{ 'abc'.isalpha() }}{{ '123'.isdigit() }}{{ ' '.isspace() }}{{ 'Ab'.istitle() }}")
    add("m_str_format", "{{ '{} and {}'.format(1, 'b') }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{x}-{y}'.format(x=3, y='z') }}|{{ '{:>5}|{:<5}|{:^5}'.format('a', 'b', 'c') }}|{{ '{:.2f} {:d} {:05d} {:x}'.format(3.14159, 42, 7, 255) }}|{{ '{{literal}}'.format() }}|{{ '{0[k]} {1.a}'.format({'k': 'v'}, ns) }}",
        ns={"a": "dict-a"})
    add("m_list_dict", "{{ [1, 2, 1].count(1) }}{{ [1, 2, 3].index(2) }}{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b', 'x') }}{{ {'a': 1}.keys()|list }}{{ {'a': 1}.values()|list }}{{ {'a': 1}.items()|list }}{{ {'a': 1}.copy() }}")

    # --- errors --------------------------------------------------------------------
    add("err_raise_exception", "{{ raise_exception('Custom failure: ' ~ n) }}", n=3)
    add("err_raise_in_loop", "{% for m in msgs %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('Invalid role ' + m.role) }}{% endif %}{{ m.role }}{% endfor %}",
        msgs=[{"role": "user"}, {"role": "robot"}])
    add("err_undefined_attr", "{{ x.y }}")
    add("err_undefined_attr_of_attr", "{{ d.a.b }}", d={})
    add("err_undefined_add", "{{ x + 1 }}")
    add("err_undefined_compare", "{{ x < 1 }}")
    add("err_undefined_call", "{{ x() }}")
    add("err_undefined_tojson", "{{ x|tojson }}")
    add("err_undefined_element", "{{ l[3].x }}", l=[1])
    add("err_type_add", "{{ 'a' + 1 }}")
    add("err_type_list_add", "{{ [1] + none }}")
    add("err_type_compare", "{{ 1 < 'a' }}")
    add("err_type_in", "{{ 1 in 'abc' }}")
    add("err_type_not_iterable", "{% for x in 5 %}{% endfor %}")
    add("err_type_not_callable", "{{ 'a'() }}")
    add("err_unpack", "{% set a, b = [1] %}")
    add("err_zero_div", "{{ 1 / 0 }}")
    add("err_zero_floordiv", "{{ 1 // 0 }}")
    add("err_unsafe_append", "{% set l = [] %}{{ l.append(1) }}")
    add("err_unsafe_update", "{% set d = {} %}{{ d.update({'a': 1}) }}")
    add("err_unsafe_pop", "{{ {'a': 1}.pop('a') }}")
    add("err_range_too_big", "{{ range(100001)|length }}")
    add("err_macro_too_many_args", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}")
    add("err_macro_bad_kwarg", "{% macro m(a) %}{% endmacro %}{{ m(b=1) }}")
    add("err_macro_no_caller", "{% macro m() %}x{% endmacro %}{% call m() %}y{% endcall %}")
    add("err_namespace_assign", "{% set x = 1 %}{% set x.a = 2 %}")
    add("err_int_undefined", "{{ x|int }}")
    add("err_items_non_mapping", "{{ [1]|items|list }}")
    add("err_generator_length", "{{ [1, 2]|select|length }}")
    add("err_join_non_str", "{{ ''.join([1]) }}")
    add("err_format_args", "{{ '%s %s' % ('a',) }}")
    add("err_str_index_method", "{{ 'abc'.index('z') }}")
    add("err_empty_separator", "{{ 'abc'.split('') }}")
    add("syntax_unclosed_block", "{% if true %}never closed")
    add("syntax_unknown_tag", "{% frobnicate %}")
    add("syntax_unknown_filter", "{{ x|frobnicate }}")
    add("syntax_unknown_test", "{{ x is frobnicated }}")
    add("syntax_unexpected_end", "{{ 1 + }}")
    add("syntax_unclosed_var", "text {{ x ")
    add("syntax_unclosed_comment", "a {# comment")
    add("syntax_bad_brace", "{{ (1 + 2] }}")
    add("syntax_stray_endfor", "{% endfor %}")
    add("syntax_default_order", "{% macro m(a=1, b) %}{% endmacro %}")
    add("syntax_break_outside", "{% break %}")
    add("syntax_chained_tests", "{{ x is defined is defined }}")
    add("syntax_assign_const", "{% set true = 1 %}")
    add("syntax_do_tag", "{% do x %}")
    add("syntax_bad_char", "{{ 1 $ 2 }}")
    add("syntax_unterminated_string", "{{ 'abc }}")

    # --- shapes real templates use -----------------------------------------------
    add("real_system_extract", "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}[{{ sys }}]{% for m in loop_messages %}<{{ m.role }}:{{ m.content|trim }}>{% endfor %}",
        messages=[{"role": "system", "content": "S"}, {"role": "user", "content": " u "}])
    add("real_alternation_check", "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{{ message['content'] }}{% endfor %}",
        messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    add("real_think_split", "{% set c = m.content %}{% if '</think>' in c %}{% set c = c.split('</think>')[-1].lstrip('\\n') %}{% endif %}[{{ c }}]",
        m={"content": "<think>\nreasoning\n</think>\n\nanswer"})
    add("real_reverse_scan", "{% set ns = namespace(last=-1) %}{% for m in messages[::-1] %}{% set i = (messages|length - 1) - loop.index0 %}{% if ns.last == -1 and m.role == 'user' %}{% set ns.last = i %}{% endif %}{% endfor %}{{ ns.last }}",
        messages=[{"role": "user"}, {"role": "assistant"}, {"role": "user"}, {"role": "tool"}])
    add("real_tools_json", "{% for t in tools %}{{ t|tojson }}\n{{ t.function|tojson(indent=4) }}\n{% endfor %}",
        tools=[{"type": "function", "function": {"name": "get_weather", "description": "Ünïcode «weather»", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
    add("real_string_repr_replace", "{{ example|string|replace(\"'\", '\"') }}", example={"a": [1, "b's", None, True], "q": 'x"y'})
    add("real_safe_concat", "{{ \"Use '\"|safe + t.name + \"' to '\"|safe + t.description + \"'\\n\"|safe + t|tojson }}",
        t={"name": "f<x>", "description": "it's \"quoted\" & <b>", "n": 1})
    add("real_content_parts", "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% elif p.type == 'image' %}<img>{% endif %}{% endfor %}{% endif %}|{% endfor %}",
        messages=[{"content": "plain"}, {"content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}])
    add("real_strftime", "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S %A %j') }}")
    add("real_items_filter_tuple", "{% for k, v in d|items %}{{ k }}={{ v|tojson }};{% endfor %}{% for key, val in d.items() if key != 'return' %}{{ key }}{% endfor %}",
        d={"name": "f", "return": {"type": "string"}, "parameters": {"a": 1}})
    add("real_message_eq", "{% set users = messages|selectattr('role', 'equalto', 'user')|list %}{% for m in messages %}{% if m == users[-1] %}LAST{% endif %}{{ m.content }} {% endfor %}",
        messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}])
    add("real_slice_json_tail", "{% set out = d|tojson %}{{ out[:-1] }}, \"id\": \"x\"}", d={"name": "n", "arguments": {"a": 1}})
    add("real_loop_prev_next", "{% for m in msgs %}{% if loop.previtem and loop.previtem.role != m.role %}|{% endif %}{{ m.role }}{% if not loop.last and loop.nextitem.role == 'tool' %}+{% endif %}{% endfor %}",
        msgs=[{"role": "user"}, {"role": "tool"}, {"role": "tool"}, {"role": "assistant"}])
    # --- assorted semantics -------------------------------------------------------
    add("misc_scope_macro_params", "{% set a = 'outer' %}{% macro m(a) %}{% set b = 1 %}{{ a }}{% endmacro %}{{ m('param') }}{{ a }}[{{ b }}]")
    add("misc_loop_not_in_macro", "{% macro m() %}[{{ loop }}]{% endmacro %}{% for i in [1] %}{{ m() }}{% endfor %}")
    add("misc_dict_key_equality", "{{ {1: 'a', true: 'b', 1.0: 'c'} }}|{{ {'a': 1, 'b': 2}['a'] }}")
    add("misc_sameas", "{{ 1 is sameas 1 }}{{ 1000 is sameas 1000 }}{{ true is sameas true }}{{ [] is sameas [] }}{{ none is sameas false }}")
    add("misc_repeat", "[{{ 'ab' * -1 }}][{{ [1] * 0 }}][{{ 'ab' * 0 }}]")
    add("misc_none_str", "{{ none|string }}|{{ none ~ '' }}|{{ [none] }}|{{ none|tojson }}|{{ none|default('x', true) }}")
    add("misc_float_repr_in_list", "{{ [1.0, 1e20, 1e-7, 0.5, 100.0, -2.5e-10, 123456789012345678.0] }}")
    add("misc_int_div", "{{ 4 / 2 }} {{ 1 / 4 }} {{ -1 / 3 }} {{ 10 // 3 * 3 + 10 % 3 }}")
    add("misc_undefined_kinds", "{{ x is iterable }}{{ x is sequence }}{{ x|list }}{{ x|items|list }}{{ x|length }}{{ x is mapping }}")
    add("misc_chain_in", "{{ 1 in [1] in [[1]] }}{{ 1 < 2 == 2 }}{{ 2 > 1 in [true] }}")
    add("misc_generator_loop", "{% for x in [1, 2, 3]|select('odd') %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% endfor %}{{ [1, 2]|select|first }}")
    add("misc_dict_dup_iter", "{% for k in {'b': 1, 'a': 2, 'b': 3} %}{{ k }}{% endfor %}")
    add("misc_percent_float", "{{ '%.3f'|format(1 / 3) }}|{{ '%5.1f|%-6.2f|%e' % (3.14159, 2.5, 12345.678) }}|{{ '%d%%' % 50 }}|{{ '%i' % 3.9 }}|{{ '%s and %r' % ('x', 'y') }}")
    add("misc_kwargs_filters", "{{ 'a\nb'|indent(width=2, first=true) }}|{{ [1, 2]|join(d='+') }}|{{ x|default(default_value='dv') }}|{{ 2.567|round(precision=1) }}|{{ 'hello world'|truncate(length=9, leeway=0) }}|{{ [1, 2, 3]|batch(linecount=2)|list }}|{{ 'aXa'|replace(old='a', new='b') }}")
    add("misc_attr_paths", "{{ items|sum(attribute='a.b') }}|{{ pairs|join(',', attribute=0) }}|{{ items|selectattr('a.b', 'gt', 1)|list|length }}|{{ items|map(attribute='a.missing', default='-')|list }}",
        items=[{"a": {"b": 1}}, {"a": {"b": 2}}], pairs=[["x", 1], ["y", 2]])
    add("misc_minmax_str", "{{ 'abc'|max }}{{ 'abc'|min }}{{ ['b', 'a', 'C']|sort|first }}{{ range(3)|reverse|list }}{{ (1, 2)|reverse|list }}")
    add("misc_namespace_attr_errors", "{% set ns = namespace(a=1) %}{{ ns.b }}|{{ ns.b is defined }}|{{ ns is mapping }}|{{ ns is defined }}")
    add("misc_namespace_chain_error", "{% set ns = namespace(a=1) %}{{ ns.b.c }}")
    add("misc_for_tuple_iter", "{% for x in 1, 2, 3 %}{{ x }}{% endfor %}{% if 0, %}T{% endif %}")
    add("misc_set_cond", "{% set x = 'a' if y is defined else 'b' %}{{ x }}{% set z = none or 'zz' %}{{ z }}")
    add("misc_string_escapes", r"""{{ '\\n' }}|{{ "it's" }}|{{ ["it's", 'say "hi"', 'both \' "'] }}|{{ 'a\
b' }}""")
    add("misc_dictsort_loop", "{% for k, v in d|dictsort(reverse=true) %}{{ k }}{{ v }}{% endfor %}|{{ d.items()|sort }}|{{ d.items()|length }}", d={"b": 2, "a": 1, "c": 0})
    add("misc_divisibleby_zero", "{{ 3 is divisibleby 0 }}")
    add("misc_truncate_assert", "{{ 'abcdef'|truncate(2) }}")
    add("misc_last_generator", "{{ [1, 2]|select|last }}")
    add("misc_markup_ops", "{{ ('<'|safe).format('<', 1) }}|{{ ('%s'|safe) % '<' }}|{{ ('a<'|safe).replace('a', '<') }}|{{ ', '|safe }}|{{ (', '|safe).join(['<', '>']) }}|{{ ('<'|safe)|tojson }}|{{ ('<'|safe) ~ '<' }}|{{ ('<'|safe) == '<' }}|{{ ['<'|safe] }}")
    add("misc_markup_strip_split", "{{ (' <a> '|safe).strip() + '<' }}|{{ ('a,b'|safe).split(',') }}|{{ ('A<'|safe)|lower + '>' }}|{{ ('<x>'|safe)|trim + '&' }}|{{ ('<x>'|safe)|center(7) + '&' }}|{{ ('ab'|safe)|reverse + '&' }}")
    add("misc_escape_nonstring", "{{ 5|e }}|{{ none|e }}|{{ [1, '<']|e }}|{{ {'a': '&'}|e }}")
    add("misc_unicode_case", "{{ 'ÀÉÎõü'|lower }}|{{ 'àéîõü ÿ ß'|upper }}|{{ 'İ'|lower|length }}|{{ 'ΑΒΓ δεζ'|title }}|{{ 'éCOLE'|capitalize }}|{{ 'привет мир'|title }}|{{ 'ＡＢＣ'|lower }}")
    add("misc_wordcount_unicode", "{{ 'héllo wörld, 日本語 — ok_1'|wordcount }}")
    add("misc_str_methods_unicode", "{{ 'héllo'.upper() }}|{{ 'Ünïcödé'.lower() }}|{{ 'naïve café'.title() }}|{{ 'ß'.upper() }}|{{ '  ünï  '.strip() }}|{{ 'a\u00a0b'.split() }}|{{ 'x\u2028y'.splitlines() }}")
    add("misc_slices", "{{ 'abcdef'[1:5:2] }}{{ 'abcdef'[-2:] }}{{ 'abcdef'[:-10] }}{{ [1, 2, 3, 4][::-2] }}{{ [1, 2, 3][1:1] }}{{ 'héllo'[1:3] }}{{ (1, 2, 3)[::2] }}{{ range(10)[::3]|list }}")
    add("misc_bool_arith_print", "{{ true }}{{ true + true }}{{ [true, false] }}{{ true|string }}{{ true|tojson }}{{ true|int }}{{ 1 == true }}")
    add("misc_loop_changed_multi", "{% for a in [1, 1, 2] %}{{ loop.changed(a, 'x') }}{% endfor %}")
    add("misc_cycler_joiner", "{% set c = cycler('odd', 'even') %}{% for i in range(3) %}{{ c.next() }}{% endfor %}{{ c.current }}|{% set j = joiner(' | ') %}{% for i in range(3) %}{{ j() }}{{ i }}{% endfor %}")
    add("misc_dict_global", "{{ dict(a=1, b=2) }}{{ dict([('x', 1)]) }}{{ dict({'k': 'v'}, z=0) }}")
    add("misc_macro_defaults_ref_outer", "{% set g = 'G' %}{% macro m(a=g) %}{{ a }}{% endmacro %}{{ m() }}{{ m('x') }}")
    add("misc_call_kwargs_unpack", "{% macro m(a, b) %}{{ a }}-{{ b }}{% endmacro %}{{ m(*[1, 2]) }}|{{ m(**{'a': 3, 'b': 4}) }}|{{ m(1, **{'b': 5}) }}")
    add("misc_none_comparisons", "{{ none == 0 }}{{ none != none }}{{ none in [none] }}{{ [] == [] }}{{ {} == {} }}{{ '' == none }}")
    add("misc_tojson_nested_unicode", "{{ {'emoji': '😀', 'ctrl': '\x07\x1f', 'del': '\x7f', 'sep': '\u2028', 'quote': '\"', 'bs': '\\\\'}|tojson }}|{{ {'emoji': '😀', 'del': '\x7f'}|tojson(ensure_ascii=true) }}")
    add("misc_tojson_float_values", "{{ [0.1, 1e16, 1e-5, 3.0, -0.0, 2.5e-308]|tojson }}")
    add("misc_list_methods", "{{ [1, 2, 1].index(1, 1) }}|{{ (1, 2, 2).count(2) }}|{{ [3].copy() }}")
    add("misc_if_expression_tests", "{% if messages and messages[0].role == 'system' %}S{% endif %}{% if not messages %}E{% endif %}", messages=[])
    add("misc_filter_on_literal_call", "{{ 'abc'.upper()|lower }}{{ ('a' ~ 'b')|upper }}{{ -1|abs }}{{ (-1)|abs }}")
    cases.extend(whitespace_fuzz_cases(250))
    return cases


def whitespace_fuzz_cases(count):
    """Seeded random mixes of text, tags and whitespace-control signs, to
    compare the lexer's trim_blocks / lstrip_blocks / -/+ handling with jinja2's."""
    rng = random.Random(20240726)
    texts = ["a", " ", "  ", "\n", "\t", " \n ", "\n\n", "x y", "  \t\n", "\n  ", "\u3000", "b\n", "\r\n", "\r"]
    signs = ["", "-", "+"]

    def sign():
        return rng.choice(signs)

    def seq(depth):
        parts = []
        for _ in range(rng.randint(1, 5)):
            k = rng.random()
            if k < 0.35 or depth > 2:
                parts.append(rng.choice(texts))
            elif k < 0.5:
                parts.append("{{" + rng.choice(["", "-", "+"]) + " 'v' " + rng.choice(["", "-"]) + "}}")
            elif k < 0.6:
                parts.append("{#" + sign() + " c " + sign() + "#}")
            elif k < 0.7:
                parts.append("{%" + sign() + " set q = 1 " + sign() + "%}")
            elif k < 0.85:
                parts.append("{%" + sign() + " if true " + sign() + "%}" + seq(depth + 1) + "{%" + sign() + " endif " + sign() + "%}")
            elif k < 0.95:
                parts.append("{%" + sign() + " for i in [1, 2] " + sign() + "%}" + seq(depth + 1) + "{{ i }}{%" + sign() +
                             " endfor " + sign() + "%}")
            else:
                parts.append("{%" + rng.choice(["", "-"]) + " raw " + rng.choice(["", "-"]) + "%}" + rng.choice(texts) +
                             "{{ r }}" + rng.choice(texts) + "{%" + sign() + " endraw " + sign() + "%}")
        return "".join(parts)

    return [(f"ws_fuzz_{i}", seq(0), {}) for i in range(count)]


# ---------------------------------------------------------------------------
# model templates x conversations

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_docs",
        "description": "Search the documentation",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "What to look for", "examples": ["paged attention"]},
            "max_results": {"type": "integer", "description": "How many results", "default": 5, "minimum": 1, "maximum": 20},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "Filter by tags"},
            "since": {"type": ["string", "null"], "format": "date", "nullable": True, "description": "Only newer documents."}},
            "required": ["query"]}}},
]

SYSTEM = "You are a helpful assistant."
UNICODE_USER = "  Héllo 🌍 — «quotes» \"double\" 'single' \\ backslash\n\ttab and <tags> & ampersands  "


def tool_conversation(args_as_string):
    args = {"city": "Paris", "unit": "celsius"}
    return [
        {"role": "system", "content": "You are a helpful assistant with tools."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call12345", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps(args) if args_as_string else args}}]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temperature\": 21, \"condition\": \"sunny\"}"},
        {"role": "assistant", "content": "It is 21°C and sunny in Paris."},
        {"role": "user", "content": "Thanks! And in Zürich?"},
    ]


# name -> (messages, extra context, render with add_generation_prompt=False too)
CONVERSATIONS = {
    "single_user": ([{"role": "user", "content": "Hello! How are you?"}], {}, True),
    "system_user": ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2+2?"}], {}, False),
    "multi_turn": ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": "2+2 equals 4."}, {"role": "user", "content": "And times 3?"}], {}, True),
    "multi_turn_no_system": ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                              {"role": "user", "content": "Tell me a joke."}, {"role": "assistant", "content": "Why did the chicken cross the road?"},
                              {"role": "user", "content": "Why?"}], {}, False),
    "unicode_whitespace": ([{"role": "user", "content": UNICODE_USER}, {"role": "assistant", "content": " Ça va ✓ \n"},
                            {"role": "user", "content": "日本語で答えて。"}], {}, False),
    "content_parts": ([{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                       {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "this picture."}]}], {}, False),
    "content_image": ([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is in the image? "}]}], {}, False),
    "reasoning": ([{"role": "user", "content": "What is 6*7?"},
                   {"role": "assistant", "content": "<think>\n6 times 7 is 42.\n</think>\n\nThe answer is 42."},
                   {"role": "user", "content": "And 6*8?"}], {"enable_thinking": False}, False),
    "tools_dict_args": (tool_conversation(False), {"tools": TOOLS}, True),
    "tools_string_args": (tool_conversation(True), {"tools": TOOLS}, False),
    # One plain tool: templates that recurse into JSON-schema types (Hermes,
    # Command R+) hit Python's recursion limit on TOOLS' ["string", "null"] type.
    "tools_simple": (tool_conversation(False), {"tools": TOOLS[:1]}, False),
    "tools_no_calls": ([{"role": "user", "content": "Search the docs for paged attention."}], {"tools": TOOLS}, False),
    "documents": ([{"role": "user", "content": "Summarize the document."}],
                  {"documents": [{"title": "Doc 1", "text": "Paris is the capital of France."}]}, False),
    "roles_not_alternating": ([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}], {}, False),
    "system_only": ([{"role": "system", "content": SYSTEM}], {}, False),
    "empty": ([], {}, False),
}

LLAMA3 = ("<|begin_of_text|>", "<|eot_id|>")
TEMPLATE_TOKENS = {  # bos, eos of each model family
    "CohereForAI-c4ai-command-r-plus-tool_use": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": ("<|begin_of_text|>", "<|im_end|>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("<|begin_of_text|>", "<|im_end|>"),
    "Qwen-Qwen2.5-7B-Instruct": ("", "<|im_end|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "fireworks-ai-llama-3-firefunction-v2": LLAMA3,
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "llama-cpp-deepseek-r1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "meetkai-functionary-medium-v3.1": LLAMA3,
    "meetkai-functionary-medium-v3.2": LLAMA3,
    "meta-llama-Llama-3.1-8B-Instruct": LLAMA3,
    "meta-llama-Llama-3.2-3B-Instruct": LLAMA3,
    "meta-llama-Llama-3.3-70B-Instruct": LLAMA3,
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "mistralai-Mistral-Small-3.1-24B-Instruct-2503": ("<s>", "</s>"),
    "deepseek-ai-DeepSeek-V3.1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "moonshotai-Kimi-K2": ("", "<|im_end|>"),
    "GLM-4.6": ("", "<|endoftext|>"),
    "hf-llama3": ("<|begin_of_text|>", "<|end_of_text|>"),
    "hf-qwen3": ("", "<|im_end|>"),
    "gemma3": ("<bos>", "<eos>"),
}
TEMPLATE_EXTRA = {  # variables a template needs that transformers users pass
    "fireworks-ai-llama-3-firefunction-v2": {"functions": json.dumps([t["function"] for t in TOOLS], indent=2),
                                              "datetime": "2024-07-26"},
}


def gemma3_template():
    """The template compiled into src/chat/chat_template.cpp (kGemma3Template)."""
    src = open(os.path.join(ROOT, "src", "tokenizer", "chat_template.cpp"), encoding="utf-8").read()
    m = re.search(r'kGemma3Template =\s*R"TPL\((.*?)\)TPL"', src, re.S)
    return m.group(1)


def model_templates():
    """(name, source description, template text); skips sources that are missing."""
    out = []
    folder = os.path.join(SHARED, "chat-templates")
    for fn in sorted(os.listdir(folder)):
        if fn.endswith(".jinja"):
            with open(os.path.join(folder, fn), encoding="utf-8", newline="") as f:
                out.append((fn[:-6], "chat-templates/" + fn, f.read()))
    extra = os.path.join(OUT_DIR, "extra")
    for fn in sorted(os.listdir(extra)):
        if fn.endswith(".jinja"):
            with open(os.path.join(extra, fn), encoding="utf-8", newline="") as f:
                out.append((fn[:-6], "fixtures:extra/" + fn, f.read()))
    for fam in ["llama3", "qwen3"]:
        with open(os.path.join(SHARED, "hf-tokenizers", fam, "tokenizer_config.json"), encoding="utf-8") as f:
            out.append(("hf-" + fam, f"hf-tokenizers/{fam}/tokenizer_config.json", json.load(f)["chat_template"]))
    out.append(("gemma3", "builtin:gemma3", gemma3_template()))
    return out


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    lang = []
    for name, template, ctx in language_cases():
        case = {"name": name, "template": template, "context": ctx}
        case.update(render(template, ctx))
        lang.append(case)
    meta = {"generator": "tools/gen_chat_template_fixtures.py", "jinja2": jinja2.__version__,
            "fixed_now": FIXED_NOW.isoformat()}
    with open(os.path.join(OUT_DIR, "language.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump({"meta": meta, "cases": lang}, f, ensure_ascii=False, indent=1)
        f.write("\n")

    templates, cases = [], []
    for name, source, text in model_templates():
        bos, eos = TEMPLATE_TOKENS[name]
        templates.append({"name": name, "source": source, "sha256": hashlib.sha256(text.encode()).hexdigest(),
                          "bos_token": bos, "eos_token": eos})
        for conv, (messages, extra, both) in CONVERSATIONS.items():
            for agp in ([True, False] if both else [True]):
                extra_all = dict(TEMPLATE_EXTRA.get(name, {}))
                extra_all.update(extra)
                ctx = {"messages": messages, "tools": None, "documents": None, "add_generation_prompt": agp,
                       "bos_token": bos, "eos_token": eos}
                ctx.update(extra_all)
                case = {"template": name, "conversation": conv, "add_generation_prompt": agp,
                        "messages": messages, "extra": extra_all}
                case.update(render(text, ctx))
                cases.append(case)
    with open(os.path.join(OUT_DIR, "models.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump({"meta": meta, "templates": templates, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")

    errors = sum("error" in c for c in lang)
    merr = {}
    for c in cases:
        if "error" in c:
            merr[c["error"]["type"]] = merr.get(c["error"]["type"], 0) + 1
    print(f"language.json: {len(lang)} cases ({errors} errors)")
    print(f"models.json: {len(templates)} templates, {len(cases)} cases, errors by type: {merr}")


if __name__ == "__main__":
    sys.exit(main())
