"""Drives `cortex serve` with the official clients, unmodified: `openai`
(online API, Files and Batches), `ollama`, and `prometheus_client`'s parser
on /metrics. Every check asserts; the script exits non-zero on the first
failure, printing what it saw.

Usage: serve_clients.py BASE_URL API_KEY WORK_DIR
"""

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import ollama
import openai
from prometheus_client.openmetrics.parser import text_string_to_metric_families

BASE, KEY, WORK = sys.argv[1], sys.argv[2], Path(sys.argv[3])
client = openai.OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, timeout=300)


def say(what, value=""):
    print(f"{what}: {value}", flush=True)


def raw(method, path, body=None, key=KEY, content_type="application/json"):
    """A request outside the clients (status, parsed body)."""
    headers = {"Content-Type": content_type}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(BASE + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metrics():
    """Every sample of /metrics as {(name, labels): value}, parsed by prometheus_client."""
    status, text = raw("GET", "/metrics")
    assert status == 200, (status, text)
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def error_shape(status, text, expected_status, fragment):
    assert status == expected_status, (status, text)
    error = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert fragment in error["message"], (fragment, error)
    return error


before = metrics()

# ---- Models ----
models = client.models.list()
model = models.data[0].id
# The default model first, then the registry's others.
assert [m.id for m in models.data].count(model) == 1, models.data
assert client.models.retrieve(model).id == model
# One model, one creation time, listed or retrieved.
for listed in models.data:
    assert client.models.retrieve(listed.id).created == listed.created, listed
say("model", model)

# ---- Chat: whole and streamed, greedy, the same text ----
messages = [{"role": "user", "content": "Name three colours."}]
whole = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
text = whole.choices[0].message.content
assert whole.object == "chat.completion" and text, whole
assert whole.usage.completion_tokens > 0
chunks = []
usage = None
stream = client.chat.completions.create(
    model="default", messages=messages, max_tokens=24, temperature=0, stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    assert chunk.object == "chat.completion.chunk", chunk
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.content:
            chunks.append(choice.delta.content)
streamed = "".join(chunks)
assert streamed == text, (streamed, text)
assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens, usage
say("chat", text)

# ---- Completions, responses, embeddings ----
completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
assert completion.object == "text_completion" and completion.choices[0].text, completion
streamed = "".join(
    c.choices[0].text
    for c in client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True)
    if c.choices
)
assert streamed == completion.choices[0].text, (streamed, completion)

# A list of prompts: n choices for each, choice p * n + k continuing prompt p.
prompts = ["The capital of France is", "One, two, three,"]
counting = client.completions.create(model=model, prompt=prompts[1], max_tokens=8, temperature=0)
several = client.completions.create(model=model, prompt=prompts, n=2, max_tokens=8, temperature=0)
assert [c.index for c in several.choices] == [0, 1, 2, 3], several
assert [c.text for c in several.choices] == [completion.choices[0].text] * 2 + [counting.choices[0].text] * 2, several
assert several.usage.prompt_tokens == completion.usage.prompt_tokens + counting.usage.prompt_tokens, several.usage
streamed = {}
for chunk in client.completions.create(model=model, prompt=prompts, n=2, max_tokens=8, temperature=0, stream=True):
    for choice in chunk.choices:
        streamed[choice.index] = streamed.get(choice.index, "") + choice.text
assert streamed == {c.index: c.text for c in several.choices}, (streamed, several)
say("prompt list", [c.text for c in several.choices])

# ---- Streamed log probabilities: in the chunks with their tokens, as the whole answer has them ----
whole = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2)
entries, texts = [], []
for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0,
                                            logprobs=True, top_logprobs=2, stream=True):
    for choice in chunk.choices:
        if choice.delta.content:
            texts.append(choice.delta.content)
            assert choice.logprobs and choice.logprobs.content, chunk  # a text chunk carries its tokens
        if choice.logprobs and choice.logprobs.content:
            entries.extend(choice.logprobs.content)
wanted = whole.choices[0].logprobs.content
assert [e.token for e in entries] == [e.token for e in wanted], (entries, wanted)
assert all(abs(a.logprob - b.logprob) < 1e-3 and len(a.top_logprobs) == 2 for a, b in zip(entries, wanted)), (entries, wanted)
assert "".join(texts) == whole.choices[0].message.content
whole = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=2)
tokens, offsets = [], []
for chunk in client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0,
                                       logprobs=2, stream=True):
    for choice in chunk.choices:
        if choice.logprobs and choice.logprobs.tokens:
            tokens.extend(choice.logprobs.tokens)
            offsets.extend(choice.logprobs.text_offset)
assert tokens == whole.choices[0].logprobs.tokens, (tokens, whole.choices[0].logprobs)
assert offsets == whole.choices[0].logprobs.text_offset, (offsets, whole.choices[0].logprobs)
say("streamed logprobs", len(entries))
response = client.responses.create(model=model, input="Say hello.", max_output_tokens=16, temperature=0)
assert response.status in ("completed", "incomplete") and response.output_text, response
events = [e.type for e in client.responses.create(model=model, input="Say hello.", max_output_tokens=16, temperature=0, stream=True)]
assert events[0] == "response.created" and events[-1] in ("response.completed", "response.incomplete"), events
assert "response.output_text.delta" in events, events
# Responses are kept (store, the default): read back, then deleted; store: false keeps nothing.
kept = client.responses.retrieve(response.id)
assert kept.id == response.id and kept.output_text == response.output_text, kept
streamed_events = list(client.responses.create(model=model, input="Say hello.", max_output_tokens=16, temperature=0, stream=True))
streamed_id = streamed_events[-1].response.id
assert client.responses.retrieve(streamed_id).output_text == streamed_events[-1].response.output_text
client.responses.delete(response.id)
for gone in [response.id, client.responses.create(model=model, input="Hi", max_output_tokens=4, store=False).id]:
    try:
        client.responses.retrieve(gone)
        raise AssertionError(f"{gone} was kept")
    except openai.NotFoundError as error:
        assert "No such Response object" in str(error), error
embeddings = client.embeddings.create(model=model, input=["a cat", "a dog"])
assert len(embeddings.data) == 2 and len(embeddings.data[0].embedding) > 0
say("completions, responses, embeddings", f"{len(events)} response events")

# ---- Errors in OpenAI's shape ----
try:
    client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=4)
    raise AssertionError("an unknown model was served")
except openai.NotFoundError as error:
    assert error.body["code"] == "model_not_found", error.body
try:
    openai.OpenAI(base_url=f"{BASE}/v1", api_key="wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as error:
    assert error.status_code == 401
error_shape(*raw("GET", "/v1/models", key=None), 401, "no API key")
error_shape(*raw("POST", "/v1/chat/completions", b"{not json"), 400, "not valid JSON")
error = error_shape(*raw("POST", "/v1/chat/completions", {"messages": messages, "temprature": 1}), 400, "unknown field")
assert error["param"] == "temprature", error
error_shape(*raw("POST", "/v1/completions", {"prompt": "x", "top_p": 7}), 400, "top_p = 7")
error = error_shape(*raw("POST", "/v1/completions", {"prompt": "word " * 9000, "max_tokens": 4}), 400, "")
assert error["code"] == "context_length_exceeded", error
error_shape(*raw("GET", "/v1/nothing"), 404, "no route")
assert raw("GET", "/health", key=None)[0] == 200
say("errors", "shapes and statuses as OpenAI's")

# ---- A client that goes away cancels its request (streamed or not) ----
def abandoned_request_stops(stream):
    request = urllib.request.Request(
        BASE + "/v1/completions",
        data=json.dumps({"prompt": "Count: 1, 2, 3,", "max_tokens": 4000, "ignore_eos": True, "stream": stream}).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    try:
        connection = urllib.request.urlopen(request, timeout=1 if not stream else 60)
        connection.readline()
        connection.close()
    except (TimeoutError, urllib.error.URLError):
        pass  # the whole answer would take far longer than the client waits
    deadline = time.time() + 20
    while time.time() < deadline:
        now = metrics()
        if metric(now, "cortex_online_requests_in_flight") == 0 and metric(now, "cortex_running_sequences") == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"the abandoned request (stream={stream}) kept running")


abandoned_request_stops(stream=True)
abandoned_request_stops(stream=False)
say("disconnect", "the engine stopped both abandoned requests")

# ---- Files and Batches ----
lines = [
    {"custom_id": f"b-{i}", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": model, "messages": [{"role": "user", "content": f"Say the number {i}."}], "max_tokens": 8, "temperature": 0}}
    for i in range(6)
]
path = WORK / "batch.jsonl"
path.write_text("".join(json.dumps(line) + "\n" for line in lines))
uploaded = client.files.create(file=path.open("rb"), purpose="batch")
assert uploaded.bytes == path.stat().st_size and uploaded.filename == "batch.jsonl", uploaded
assert client.files.retrieve(uploaded.id).id == uploaded.id
assert uploaded.id in [f.id for f in client.files.list()]
batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"run": "test"})
assert batch.status in ("validating", "in_progress", "finalizing", "completed"), batch
deadline = time.time() + 300
while batch.status not in ("completed", "failed", "cancelled"):
    assert time.time() < deadline, batch
    time.sleep(0.5)
    batch = client.batches.retrieve(batch.id)
assert batch.status == "completed", batch
assert batch.request_counts.total == 6 and batch.request_counts.completed == 6, batch
assert batch.metadata == {"run": "test"}, batch.metadata
output = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
assert [o["custom_id"] for o in output] == [f"b-{i}" for i in range(6)], output
for line in output:
    openai.types.chat.ChatCompletion.model_validate(line["response"]["body"])
say("batch", f"{batch.id} completed, {len(output)} output lines")

# A batch line may hold a completions prompt list, as online.
path = WORK / "listed.jsonl"
path.write_text(json.dumps({"custom_id": "listed", "method": "POST", "url": "/v1/completions",
                            "body": {"model": model, "prompt": prompts, "max_tokens": 8, "temperature": 0}}) + "\n")
listed = client.batches.create(input_file_id=client.files.create(file=path.open("rb"), purpose="batch").id,
                               endpoint="/v1/completions", completion_window="24h")
deadline = time.time() + 120
while listed.status != "completed":
    assert time.time() < deadline and listed.status not in ("failed", "cancelled"), listed
    time.sleep(0.3)
    listed = client.batches.retrieve(listed.id)
body = json.loads(client.files.content(listed.output_file_id).text)["response"]["body"]
listed = openai.types.Completion.model_validate(body)
assert [c.text for c in listed.choices] == [several.choices[0].text, several.choices[2].text], listed

# Files: uploads and batch outputs, by purpose, in either order, paged.
everything = list(client.files.list(limit=100))
assert batch.output_file_id in [f.id for f in everything] and uploaded.id in [f.id for f in everything], everything
outputs = client.files.list(purpose="batch_output", limit=100).data
assert outputs and all(f.purpose == "batch_output" for f in outputs), outputs
assert batch.output_file_id in [f.id for f in outputs], outputs
assert [f.purpose for f in client.files.list(purpose="batch", limit=100).data] == ["batch"] * sum(f.purpose == "batch" for f in everything)
newest_first = [(f.created_at, f.id) for f in client.files.list(limit=100).data]
oldest_first = [(f.created_at, f.id) for f in client.files.list(order="asc", limit=100).data]
assert oldest_first == sorted(oldest_first) and newest_first == oldest_first[::-1], (newest_first, oldest_first)
first = client.files.list(limit=1)
second = client.files.list(limit=1, after=first.data[0].id)
assert first.has_more and second.data[0].id == newest_first[1][1], (first, second)

# The job the CLI submitted before the server started is a batch too.
listed = [b.id for b in client.batches.list(limit=100)]
assert "batch_1" in listed and batch.id in listed, listed
assert client.batches.list(limit=1).has_more

# Cancel a long batch.
long_lines = [
    {"custom_id": f"l-{i}", "method": "POST", "url": "/v1/completions",
     "body": {"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True}}
    for i in range(200)
]
path = WORK / "long.jsonl"
path.write_text("".join(json.dumps(line) + "\n" for line in long_lines))
long_batch = client.batches.create(input_file_id=client.files.create(file=path.open("rb"), purpose="batch").id,
                                   endpoint="/v1/completions", completion_window="24h")
cancelled = client.batches.cancel(long_batch.id)
assert cancelled.status in ("cancelling", "cancelled"), cancelled
deadline = time.time() + 120
while cancelled.status != "cancelled":
    assert time.time() < deadline, cancelled
    time.sleep(0.5)
    cancelled = client.batches.retrieve(long_batch.id)
assert cancelled.request_counts.completed < 200, cancelled
say("cancel", f"{cancelled.request_counts.completed} of 200 completed before the cancel")

# A batch not done in its window expires: what finished is kept, the rest is batch_expired.
slow = client.batches.create(input_file_id=client.files.create(file=path.open("rb"), purpose="batch").id,
                             endpoint="/v1/completions", completion_window="2s")
assert slow.completion_window == "2s" and slow.expires_at - slow.created_at == 2, slow
deadline = time.time() + 60
while slow.status != "expired":
    assert time.time() < deadline and slow.status == "in_progress", slow
    time.sleep(0.3)
    slow = client.batches.retrieve(slow.id)
assert slow.expired_at and slow.request_counts.completed < 200, slow
expired = [json.loads(line) for line in client.files.content(slow.error_file_id).text.splitlines()]
assert len(expired) == 200 - slow.request_counts.completed, (len(expired), slow)
assert all(e["error"]["code"] == "batch_expired" for e in expired), expired[0]
say("expired", f"{slow.request_counts.completed} of 200 completed in the 2 s window")

# An invalid file: a failed batch whose errors name the lines.
path = WORK / "invalid.jsonl"
path.write_text(
    json.dumps(lines[0]) + "\n"
    + json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [], "max_tokens": 4}}) + "\n"
    + "{broken\n"
)
failed = client.batches.create(input_file_id=client.files.create(file=path.open("rb"), purpose="batch").id,
                               endpoint="/v1/chat/completions", completion_window="24h")
assert failed.status == "failed", failed
assert [e.line for e in failed.errors.data] == [2, 3], failed.errors
assert "messages" in failed.errors.data[0].message, failed.errors
assert client.batches.retrieve(failed.id).status == "failed"
say("invalid file", "; ".join(f"line {e.line}: {e.message}" for e in failed.errors.data))
deleted = client.files.delete(uploaded.id)
assert deleted.deleted
try:
    client.files.retrieve(uploaded.id)
    raise AssertionError("a deleted file is still there")
except openai.NotFoundError:
    pass

# ---- Ollama ----
ollama_client = ollama.Client(host=BASE, headers={"Authorization": f"Bearer {KEY}"})
listed = ollama_client.list().models
names = [m.model for m in listed]
assert model in names, names
# Each listed model says what it can, as /api/show does (read raw: the
# client's ListResponse keeps only the fields it knows).
tags = json.loads(urllib.request.urlopen(urllib.request.Request(f"{BASE}/api/tags", headers={"Authorization": f"Bearer {KEY}"})).read())
assert all(m["capabilities"][:2] == ["completion", "tools"] for m in tags["models"]), tags
reply = ollama_client.chat(model=model, messages=[{"role": "user", "content": "Say hi."}], options={"num_predict": 12, "temperature": 0})
assert reply.done and reply.message.role == "assistant" and reply.message.content, reply
parts = list(ollama_client.generate(model=model, prompt="Say hi.", stream=True, options={"num_predict": 12, "temperature": 0}))
assert parts[-1].done and parts[-1].eval_count > 0, parts[-1]
generated = "".join(p.response for p in parts)
assert generated, parts
as_json = ollama_client.generate(model=model, prompt="Give a JSON object with a key a.", format="json", options={"num_predict": 24, "temperature": 0})
assert as_json.response.strip().startswith("{"), as_json.response
shown = ollama_client.show(model)
assert shown.details.format == "gguf", shown.details
# SmolLM2's own template: tools, no thinking.
assert shown.capabilities == ["completion", "tools"], shown.capabilities
assert [m.model for m in ollama_client.ps().models] == [model]
try:
    ollama.Client(host=BASE).list()
    raise AssertionError("ollama routes served without a key")
except ollama.ResponseError as error:
    assert error.status_code == 401
say("ollama", f"chat {reply.message.content!r}, generate {generated!r}")

# ---- Metrics moved ----
after = metrics()
chat_ok = metric(after, "cortex_http_requests_total", endpoint="/v1/chat/completions", status="200")
assert chat_ok - metric(before, "cortex_http_requests_total", endpoint="/v1/chat/completions", status="200") >= 2, chat_ok
assert metric(after, "cortex_http_requests_total", endpoint="/v1/models", status="401") >= 1
assert metric(after, "cortex_online_generated_tokens_total") > metric(before, "cortex_online_generated_tokens_total")
assert metric(after, "cortex_time_to_first_token_seconds_count", endpoint="/v1/chat/completions") >= 2
assert metric(after, "cortex_engine_steps_total") > 0
assert metric(after, "cortex_engine_generated_tokens_total") >= metric(after, "cortex_online_generated_tokens_total")
say("metrics", f"{int(chat_ok)} chat requests, {int(metric(after, 'cortex_engine_generated_tokens_total'))} tokens generated")

# ---- The same figures as JSON, with the process's and machine's gauges ----
status, text = raw("GET", "/v1/metrics")
assert status == 200, (status, text)
figures = json.loads(text)
assert figures["engine"]["generated_tokens"] >= metric(after, "cortex_engine_generated_tokens_total") > 0
assert figures["engine"]["steps"] >= metric(after, "cortex_engine_steps_total")
assert figures["models"][0]["name"] == model, figures["models"]
system = figures["system"]
assert system["process_resident_memory_bytes"] > 0 and system["machine_cpus"] >= 1, system
assert 0 < system["machine_memory_available_bytes"] <= system["machine_memory_total_bytes"], system
assert metric(after, "cortex_process_resident_memory_bytes") > 0
assert metric(after, "cortex_machine_memory_total_bytes") == system["machine_memory_total_bytes"]
assert figures["device"]["memory_total_bytes"] > 0, figures["device"]
assert raw("GET", "/v1/metrics", key=None)[0] == 401
say("metrics json", f"{figures['engine']['generated_tokens']} tokens, {system['process_resident_memory_bytes'] >> 20} MiB resident")
print("ALL CHECKS PASSED")
