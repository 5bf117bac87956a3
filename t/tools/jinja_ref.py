#!/usr/bin/env python3
"""The reference chat-template renderer kvgate's Jinja engine is checked against.

Renders a chat template the way Hugging Face transformers' apply_chat_template
does (its _compile_jinja_template and render call, restated here so that the
test needs Jinja2 only: Debian's python3-jinja2), from the same inputs as

    kvgate-tokenize --chat MESSAGES.json (--template FILE.jinja | --tokenizer MODEL)
        [--tools TOOLS.json] [--template-kwargs JSON] [--add-generation-prompt]
        [--bos-token TEXT] [--eos-token TEXT] --text

and with the same request -> variables conversion as src/chat_vars.c (vLLM's):
developer -> system, text parts joined with "\\n", tool-call arguments parsed,
reasoning_content (or reasoning) under both names, vLLM's key order, tools None
when absent. Prints the rendered prompt byte for byte; a template
that raises (or fails) exits 1 with its message on stderr ("raise_exception:
MESSAGE" for the template's own refusals). --jobs FILE renders many at once.

--tokenizer takes a model directory or a tokenizer.json (the template and
bos/eos from tokenizer_config.json / chat_template.jinja beside it, as
src/chat_source.c finds them); GGUF files are not read here.
KVGATE_TEMPLATE_NOW=SECONDS fixes strftime_now's clock, as in kvgate.
"""
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTracker(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: renders its body (transformers
    uses it to mark assistant tokens; the text is unchanged)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class Raised(jinja2.exceptions.TemplateError):
    """What raise_exception raises (transformers raises TemplateError itself;
    a subclass tells the template's own refusals from other errors)."""


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    now = os.environ.get("KVGATE_TEMPLATE_NOW")
    when = datetime.fromtimestamp(int(now)) if now else datetime.now()
    return when.strftime(fmt)


def compile_template(source):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


class Invalid(Exception):
    pass


def content_text(content, role, has_calls):
    if content is None:
        if has_calls:
            return ""
        raise Invalid("a %s message needs content" % role)
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content)


def convert_message(m):
    """One request message -> the template's message (chat_vars.h's rules)."""
    role = m["role"]
    if role == "developer":
        role = "system"
    calls = m.get("tool_calls") if role == "assistant" else None
    out = {"role": role, "content": content_text(m.get("content"), role, bool(calls))}
    if calls:
        converted = []
        for call in calls:
            call = dict(call)
            fn = dict(call["function"])
            args = fn["arguments"]
            fn["arguments"] = json.loads(args) if args != "" else {}
            call["function"] = fn
            converted.append(call)
        out["tool_calls"] = converted
    if role == "assistant":
        reasoning = m.get("reasoning_content")
        if reasoning is None:
            reasoning = m.get("reasoning")
        if reasoning is not None:
            out["reasoning"] = out["reasoning_content"] = reasoning
    if role == "tool":
        out["tool_call_id"] = m["tool_call_id"]
    if m.get("name") is not None:
        out["name"] = m["name"]
    return out


def special_text(cfg, key):
    v = cfg.get(key)
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def model_template(path):
    """(template source, bos, eos) of a model directory or tokenizer.json."""
    if not os.path.isdir(path):
        with open(path, "rb") as f:
            if f.read(4) == b"GGUF":
                raise Invalid("%s: GGUF files are not read here: give --template" % path)
    d = path if os.path.isdir(path) else os.path.dirname(path) or "."
    cfg = {}
    cfg_path = os.path.join(d, "tokenizer_config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    jinja_path = os.path.join(d, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            source = f.read()
    else:
        source = cfg.get("chat_template")
        if isinstance(source, list):
            source = next((t["template"] for t in source if t.get("name") == "default"), None)
        if not isinstance(source, str):
            raise Invalid("%s: no chat template" % d)
    return source, special_text(cfg, "bos_token"), special_text(cfg, "eos_token")


def run(argv):
    """Renders per argv (kvgate-tokenize's options): (exit status, output text,
    message)."""
    opts = {"--chat": None, "--template": None, "--tokenizer": None, "--tools": None,
            "--template-kwargs": None, "--bos-token": None, "--eos-token": None}
    flags = {"--add-generation-prompt": False, "--text": False}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in flags:
            flags[a] = True
        elif a in opts and i + 1 < len(argv):
            i += 1
            opts[a] = argv[i]
        else:
            return 2, "", "unknown or incomplete option %r" % a
        i += 1
    if not opts["--chat"] or not (opts["--template"] or opts["--tokenizer"]):
        return 2, "", "--chat and --template or --tokenizer are required"

    try:
        with open(opts["--chat"], encoding="utf-8") as f:
            req = json.load(f)
        if isinstance(req, list):
            req = {"messages": req}
        tools = req.get("tools")
        kwargs = req.get("chat_template_kwargs") or {}
        if opts["--tools"]:
            with open(opts["--tools"], encoding="utf-8") as f:
                tools = json.load(f)
        if opts["--template-kwargs"]:
            kwargs = json.loads(opts["--template-kwargs"])
        messages = [convert_message(m) for m in req["messages"]]

        bos, eos = "", ""
        if opts["--tokenizer"]:
            source, mbos, meos = model_template(opts["--tokenizer"])
            bos, eos = mbos or "", meos or ""
        if opts["--template"]:
            with open(opts["--template"], encoding="utf-8") as f:
                source = f.read()
        if opts["--bos-token"] is not None:
            bos = opts["--bos-token"]
        if opts["--eos-token"] is not None:
            eos = opts["--eos-token"]

        template = compile_template(source)
        # transformers: render(messages=, tools=, documents=, add_generation_prompt=,
        # **special tokens, **kwargs); the trusted names win over the kwargs (jinja.h)
        variables = dict(kwargs)
        variables.update(messages=messages, tools=tools, documents=None,
                         add_generation_prompt=flags["--add-generation-prompt"],
                         bos_token=bos, eos_token=eos)
        return 0, template.render(**variables), ""
    except Raised as e:
        return 1, "", "raise_exception: %s" % e
    except Exception as e:  # what Jinja2 raises: a syntax, type or sandbox error, ...
        return 1, "", "%s: %s" % (type(e).__name__, e)


def main(argv):
    if len(argv) == 2 and argv[0] == "--jobs":
        # many renders in one process (the test harness: Python's start-up and
        # Jinja2's import cost more than a render): a JSON list of argv lists
        # in, a JSON list of {"rc", "text", "err"} out
        with open(argv[1], encoding="utf-8") as f:
            jobs = json.load(f)
        results = []
        for job in jobs:
            rc, text, err = run(job)
            results.append({"rc": rc, "text": text, "err": err})
        sys.stdout.write(json.dumps(results, ensure_ascii=True))
        return 0
    rc, text, err = run(argv)
    if rc:
        sys.stderr.write("jinja_ref.py: %s\n" % err)
        return rc
    sys.stdout.buffer.write(text.encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
