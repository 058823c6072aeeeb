"""Tools through the clients people drive `cortex serve` with, unmodified,
on the default model (whose template renders no tools: cortex's generic
tools format): the `openai` package (a forced call, streamed and not),
LangChain (`bind_tools`, `with_structured_output(method="function_calling")`,
streamed), instructor (its default TOOLS mode and RESPONSES_TOOLS), LiteLLM (its `openai/`,
`ollama_chat/` and `ollama/` providers) and the `ollama` package (`tools`,
streamed and not). Every check asserts; the script exits non-zero on the
first failure, printing what it saw.

Usage: tool_clients.py BASE_URL API_KEY MODEL
"""

import json
import os
import sys

# LiteLLM reads its model table from the network unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import instructor  # noqa: E402
import litellm  # noqa: E402
import ollama  # noqa: E402
import openai  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from pydantic import BaseModel  # noqa: E402

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
litellm.telemetry = False

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the get_weather tool."}]


def say(what, value=""):
    print(f"{what}: {value}", flush=True)


def check_call(name, arguments, where):
    """A call of get_weather whose arguments match its schema."""
    assert name == "get_weather", f"{where}: called {name!r}"
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    assert isinstance(arguments, dict) and isinstance(arguments.get("city"), str), f"{where}: {arguments!r}"
    assert set(arguments) == {"city"} and len(arguments["city"]) <= 30, f"{where}: {arguments!r}"
    say(where, f"{name}({json.dumps(arguments)})")


client = openai.OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, timeout=300)

# The official client, a forced call.
answer = client.chat.completions.create(
    model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=64, temperature=0
)
message = answer.choices[0].message
assert answer.choices[0].finish_reason == "tool_calls", answer
for call in message.tool_calls:
    check_call(call.function.name, call.function.arguments, "openai")

# Streamed: the calls as tool_calls deltas, put back together by index:
# the name first, then the arguments in pieces as they are generated.
calls = {}
finish = None
argument_pieces = 0
for chunk in client.chat.completions.create(
    model=MODEL,
    messages=ASK,
    tools=[WEATHER],
    tool_choice={"type": "function", "function": {"name": "get_weather"}},
    max_tokens=64,
    temperature=0,
    stream=True,
):
    for choice in chunk.choices:
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            if delta.function.name:
                entry["name"] += delta.function.name
            if delta.function.arguments:
                entry["arguments"] += delta.function.arguments
                argument_pieces += 1
assert finish == "tool_calls" and len(calls) == 1, (finish, calls)
assert argument_pieces >= 2, (argument_pieces, calls)
check_call(calls[0]["name"], calls[0]["arguments"], "openai streamed")
say("openai streamed", f"arguments in {argument_pieces} pieces")

# Cut by max_tokens inside the call: still a call, with finish "length"
# and nothing of it in content (as OpenAI answers).
cut = client.chat.completions.create(
    model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=20, temperature=0
)
assert cut.choices[0].finish_reason == "length", cut
assert not cut.choices[0].message.content, cut
assert [c.function.name for c in cut.choices[0].message.tool_calls or []] == ["get_weather"], cut
say("openai cut short", cut.choices[0].message.tool_calls[0].function.arguments)


# LangChain: bind_tools, structured output by function calling, streamed.
@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return "sunny"


chat = ChatOpenAI(model=MODEL, base_url=f"{BASE}/v1", api_key=KEY, temperature=0, max_tokens=64, max_retries=0)
reply = chat.bind_tools([get_weather], tool_choice="get_weather").invoke(ASK[0]["content"])
assert reply.tool_calls, reply
check_call(reply.tool_calls[0]["name"], reply.tool_calls[0]["args"], "langchain bind_tools")

gathered = None
for piece in chat.bind_tools([get_weather], tool_choice="get_weather").stream(ASK[0]["content"]):
    gathered = piece if gathered is None else gathered + piece
assert gathered.tool_calls, gathered
check_call(gathered.tool_calls[0]["name"], gathered.tool_calls[0]["args"], "langchain streamed")


class Person(BaseModel):
    name: str
    age: int


person = chat.with_structured_output(Person, method="function_calling").invoke(
    "Extract the person: Ana is 31 years old."
)
assert isinstance(person, Person), person
say("langchain structured output", person)

# instructor: its default TOOLS mode, and RESPONSES_TOOLS (/v1/responses
# with a forced call and a text format together: the call holds the
# answer, shaped by its schema).
ASK_PERSON = [{"role": "user", "content": "Extract the person: Ana is 31 years old."}]
for mode in [instructor.Mode.TOOLS, instructor.Mode.RESPONSES_TOOLS]:
    patched = instructor.from_openai(openai.OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0), mode=mode)
    if mode == instructor.Mode.TOOLS:
        create, limit = patched.chat.completions.create, {"messages": ASK_PERSON, "max_tokens": 64}
    else:
        create, limit = patched.responses.create, {"input": ASK_PERSON, "max_output_tokens": 64}
    person = create(model=MODEL, response_model=Person, temperature=0, max_retries=0, **limit)
    assert isinstance(person, Person), person
    say(f"instructor {mode.name}", person)

# LiteLLM: OpenAI's API, and both of its Ollama providers.
answer = litellm.completion(
    model=f"openai/{MODEL}",
    api_base=f"{BASE}/v1",
    api_key=KEY,
    messages=ASK,
    tools=[WEATHER],
    tool_choice="required",
    max_tokens=64,
    temperature=0,
)
call = answer.choices[0].message.tool_calls[0]
check_call(call.function.name, call.function.arguments, "litellm openai/")

for provider in ["ollama_chat", "ollama"]:
    answer = litellm.completion(
        model=f"{provider}/{MODEL}",
        api_base=BASE,
        api_key=KEY,
        messages=ASK,
        tools=[WEATHER],
        max_tokens=64,
        temperature=0,
    )
    message = answer.choices[0].message
    if message.tool_calls:
        call = message.tool_calls[0]
        check_call(call.function.name, call.function.arguments, f"litellm {provider}/")
    else:
        # The model may answer in words (the model chooses; Ollama has no tool_choice).
        assert isinstance(message.content, str), answer
        say(f"litellm {provider}/ (an answer)", message.content[:60])

# The ollama package: tools, streamed and not.
ollama_client = ollama.Client(host=BASE, headers={"Authorization": f"Bearer {KEY}"})
response = ollama_client.chat(model=MODEL, messages=ASK, tools=[WEATHER], options={"temperature": 0, "num_predict": 64})
if response.message.tool_calls:
    call = response.message.tool_calls[0]
    check_call(call.function.name, dict(call.function.arguments), "ollama")
else:
    assert isinstance(response.message.content, str), response
    say("ollama (an answer)", response.message.content[:60])
streamed_calls, streamed_text = [], ""
for part in ollama_client.chat(
    model=MODEL, messages=ASK, tools=[WEATHER], stream=True, options={"temperature": 0, "num_predict": 64}
):
    streamed_calls += part.message.tool_calls or []
    streamed_text += part.message.content or ""
assert [c.function.name for c in streamed_calls] == [c.function.name for c in response.message.tool_calls or []], (
    streamed_calls,
    response,
)
assert streamed_text == (response.message.content or ""), (streamed_text, response)
say("ollama streamed", f"{len(streamed_calls)} calls")

print("ALL CHECKS PASSED")
