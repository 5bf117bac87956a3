#!/usr/bin/env python3
"""The reference side of t/bench/chat_render: what a chat request costs in Jinja2
(transformers' environment, from t/tools/jinja_ref.py): the request's variables
converted and the template rendered with add_generation_prompt, the template
compiled once. Prints "RESULT <label> <microseconds per request> <output bytes>
<reps> <microseconds of it building the variables>", process CPU time, the median of batches after a warm-up batch, as
chat_render_bench.c does.

    chat_render_ref.py TEMPLATE.jinja CONVERSATION.json LABEL
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import jinja_ref  # noqa: E402


def one(template, conv):
    """One request: variables built, template rendered (template None: the
    variables only)."""
    messages = [jinja_ref.convert_message(m) for m in conv["messages"]]
    if template is None:
        return ""
    variables = dict(conv.get("chat_template_kwargs") or {})
    variables.update(messages=messages, tools=conv.get("tools"), documents=None,
                     add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
    return template.render(**variables)


def main(path, conv_path, label):
    with open(path, encoding="utf-8") as f:
        template = jinja_ref.compile_template(f.read())
    with open(conv_path, encoding="utf-8") as f:
        conv = json.load(f)
    reps, t0 = 0, time.process_time()
    while time.process_time() - t0 < 0.05 or reps == 0:
        out = one(template, conv)
        reps += 1
    whole, variables = measure(template, conv, reps), measure(None, conv, reps)
    print("RESULT %s %.2f %d %d %.2f" % (label, whole * 1e6, len(out.encode("utf-8")), reps * 7,
                                         variables * 1e6))


def measure(template, conv, reps):
    """Median CPU seconds per one(template, conv) over 7 batches of reps."""
    per = []
    for _ in range(7):
        t0 = time.process_time()
        for _ in range(reps):
            one(template, conv)
        per.append((time.process_time() - t0) / reps)
    per.sort()
    return per[3]


if __name__ == "__main__":
    main(*sys.argv[1:4])
