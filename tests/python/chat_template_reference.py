"""Renders chat templates as Hugging Face `transformers` renders them: the
reference cortex's templates are compared with.

Usage: python chat_template_reference.py CASES.json OUT.json

CASES.json: {"templates": {NAME: SOURCE}, "conversations": {NAME: {"body":
{...an OpenAI chat body: messages, tools, reasoning_effort,
chat_template_kwargs...}}}, "bos_token": ..., "eos_token": ...}. OUT.json:
{TEMPLATE: {CONVERSATION: {"text": ...} or {"error": ...}}}.

The body is turned into what `transformers` takes as a client would hand it:
messages as they are (an assistant's tool calls with their arguments parsed
from JSON text into objects, as `transformers` documents; a null content as
an empty text, as llama.cpp hands templates that need text), `tools` (left
undefined when none are offered, as llama.cpp does: `transformers` passes
None, which the tool-use templates of Hermes and Command R cannot iterate),
the `chat_template_kwargs` as keyword arguments, `reasoning_effort` as one
more. It is rendered in `transformers`' own Jinja environment.
"""

import json
import sys

import transformers.utils.chat_template_utils as chat_utils


def messages_of(body):
    messages = []
    for message in body["messages"]:
        message = dict(message)
        if message.get("content") is None:
            message["content"] = ""
        calls = message.get("tool_calls")
        if calls:
            message["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])}}
                for call in calls
            ]
        messages.append(message)
    return messages


def render(source, body, bos_token, eos_token):
    kwargs = dict(body.get("chat_template_kwargs") or {})
    if "reasoning_effort" in body:
        kwargs.setdefault("reasoning_effort", body["reasoning_effort"])
    if body.get("tools"):
        kwargs["tools"] = body["tools"]
    template = chat_utils._compile_jinja_template(source)
    messages = chat_utils._alias_reasoning_fields(messages_of(body))
    return template.render(
        messages=messages,
        add_generation_prompt=True,
        bos_token=bos_token,
        eos_token=eos_token,
        **kwargs,
    )


def main():
    cases_path, out_path = sys.argv[1], sys.argv[2]
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    out = {}
    for name, source in cases["templates"].items():
        out[name] = {}
        for conversation, case in cases["conversations"].items():
            try:
                text = render(source, case["body"], cases["bos_token"], cases["eos_token"])
                out[name][conversation] = {"text": text}
            except Exception as error:  # a template refusing a conversation is a result too
                out[name][conversation] = {"error": f"{type(error).__name__}: {error}"}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
