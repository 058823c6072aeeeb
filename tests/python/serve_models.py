"""Many models behind one `cortex serve`, through the official `ollama` and
`openai` clients: pull with streamed progress, a blob upload and a create
with a system prompt and parameters, show, copy, list, delete, ps, embed;
chats alternating between two models under a memory budget that holds one
at a time, each answer the model's own greedy `cortex generate` output, and
another name of the loaded weights with its own template;
keep_alive 0 unloading; one batch per model.

Usage: serve_models.py SETTINGS.json (url, gguf, references, ...)."""

import json
import sys
import time

import ollama
import openai

settings = json.load(open(sys.argv[1]))
BASE = settings["url"]
client = ollama.Client(host=BASE)
refs = settings["references"]
QUESTION = settings["question"]


def say(*parts):
    print(*parts, flush=True)


def loaded():
    return [m.model for m in client.ps().models]


# A known model, with Ollama's progress lines.
progress = list(client.pull("gemma3-270m", stream=True))
statuses = [p.status for p in progress]
assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
assert any(p.total and p.completed == p.total for p in progress), progress
assert client.pull("gemma3-270m").status == "success"
try:
    client.pull("llama3")
    raise AssertionError("an unknown model was pulled")
except ollama.ResponseError as error:
    assert error.status_code == 404 and "gemma3-270m" in str(error), error

# A local GGUF: uploaded as a blob, then a model with a SYSTEM and a PARAMETER.
digest = client.create_blob(settings["gguf"])
created = client.create(
    "uploaded", files={"model.gguf": digest},
    system=settings["system"], parameters={"temperature": 0, "num_predict": 8},
)
assert created.status == "success", created
shown = client.show("uploaded")
assert shown.details.family == "llama", shown.details
assert shown.details.parameter_size == "135M", shown.details
assert shown.details.quantization_level == "Q4_1", shown.details
assert shown.modelinfo["llama.context_length"] == 8192, shown.modelinfo
assert "temperature" in shown.parameters and "num_predict" in shown.parameters, shown.parameters
assert f'SYSTEM """{settings["system"]}"""' in shown.modelfile, shown.modelfile
assert "im_start" in shown.template, shown.template
say("created uploaded", digest[:19])

# Its answer is what `cortex generate` gives on the same model.
answer = client.chat("uploaded", messages=[{"role": "user", "content": QUESTION}])
assert answer.message.content.strip() == refs["mine"], (answer.message.content, refs["mine"])

assert client.copy("uploaded", "uploaded-copy").status == "success"
names = [m.model for m in client.list().models]
for name in ["uploaded:latest", "uploaded-copy:latest", "gemma3-270m:latest", "gemma-chat:latest", "mine:latest"]:
    assert name in names, (name, names)
assert client.delete("uploaded-copy").status == "success"
assert "uploaded-copy:latest" not in [m.model for m in client.list().models]
try:
    client.delete("uploaded-copy")
    raise AssertionError("a deleted model was deleted again")
except ollama.ResponseError as error:
    assert error.status_code == 404, error

# Two models, one at a time in the memory budget, alternating.
options = {"num_predict": 8, "temperature": 0}
for _ in range(2):
    for model, expected in [(settings["default"], refs["default"]), ("gemma-chat", refs["gemma"])]:
        reply = client.chat(model, messages=[{"role": "user", "content": QUESTION}], options=options)
        assert reply.message.content.strip() == expected, (model, reply.message.content, expected)
        now = loaded()
        assert len(now) == 1 and now[0].split(":")[0] == model.split(":")[0], (model, now)
        ps = client.ps().models[0]
        assert ps.size >= 98_000_000 and ps.expires_at is not None, ps
say("alternated", loaded())
# Another name of the loaded weights (Gemma's own, where gemma-chat is
# loaded) is answered by the same engine with its own template.
own = client.chat("gemma3-270m", messages=[{"role": "user", "content": QUESTION}], options=options)
assert own.message.content.strip() == refs["gemma-own"], (own.message.content, refs["gemma-own"])
assert own.model == "gemma3-270m:latest", own.model
assert [m.split(":")[0] for m in loaded()] == ["gemma-chat"], loaded()

# keep_alive 0: unloaded as soon as the answer is given.
client.chat(settings["default"], messages=[{"role": "user", "content": QUESTION}], options=options, keep_alive=0)
assert loaded() == [], loaded()
# An empty request only loads; with keep_alive 0 it unloads.
client.generate(settings["default"], keep_alive="10m")
assert [m.split(":")[0] for m in loaded()] == [settings["default"].split(":")[0]], loaded()
client.generate(settings["default"], keep_alive=0)
assert loaded() == [], loaded()

embedded = client.embed(settings["default"], input=["a cat", "a dog"])
assert len(embedded.embeddings) == 2 and len(embedded.embeddings[0]) == 576
single = client.embeddings(settings["default"], prompt="a cat")
assert len(single.embedding) == 576
assert abs(sum(a - b for a, b in zip(single.embedding, embedded.embeddings[0]))) < 1e-3

# OpenAI's client: every model listed; an unknown one names what is installed.
oa = openai.OpenAI(base_url=f"{BASE}/v1", api_key="none", max_retries=0)
ids = [m.id for m in oa.models.list().data]
assert ids[0] == settings["default"] and "gemma-chat:latest" in ids and "uploaded:latest" in ids, ids
try:
    oa.chat.completions.create(model="nothing-here", messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("an unknown model answered")
except openai.NotFoundError as error:
    assert error.body["code"] == "model_not_found", error.body
    assert "installed:" in error.body["message"], error.body

# One batch per model, submitted together (a worker drains them after).
batches = []
for model in [settings["default"], "gemma-chat", "gemma3-270m"]:
    lines = "".join(
        json.dumps({"custom_id": f"{model}-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": model, "messages": [{"role": "user", "content": QUESTION}],
                             "max_tokens": 8, "temperature": 0}}) + "\n"
        for i in range(3))
    upload = oa.files.create(file=(f"{model}.jsonl", lines.encode()), purpose="batch")
    batch = oa.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    batches.append(batch.id)
mixed = "".join(
    json.dumps({"custom_id": f"m-{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]}}) + "\n"
    for i, model in enumerate([settings["default"], "gemma-chat"]))
upload = oa.files.create(file=("mixed.jsonl", mixed.encode()), purpose="batch")
try:
    oa.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    raise AssertionError("a batch naming two models was accepted")
except openai.BadRequestError as error:
    assert "one model" in error.body["message"], error.body
# A pulled known model chats out of the box, as `cortex generate --chat` does.
own = client.chat("gemma3-270m", messages=[{"role": "user", "content": QUESTION}], options={"num_predict": 8, "temperature": 0})
assert own.message.content.strip() == refs["gemma-own"], (own.message.content, refs["gemma-own"])
# Names sharing the default model's weights may go; its last name stays
# while the server serves it.
assert client.delete("uploaded").status == "success"
assert client.delete("mine").status == "success"
try:
    client.delete(settings["default"])
    raise AssertionError("the default model was deleted")
except ollama.ResponseError as error:
    assert error.status_code == 409 and "default model" in str(error), error
print(json.dumps({"batches": batches}))
