"""Two projects and an admin on one `cortex serve`, through the official
`openai` client: neither project sees, downloads, cancels or deletes the
other's files and batches (each is "not found"), lists hold only one's own,
an admin key sees every project's (and the CLI's `default` jobs), `/metrics`
needs an admin key, and one project's prompts are not served from, nor
counted as, another's prefix cache.

Usage: projects.py BASE_URL ALPHA_KEY BETA_KEY ADMIN_KEY WORK_DIR
"""

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai

BASE, ALPHA, BETA, ADMIN, WORK = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], Path(sys.argv[5])


def client(key):
    return openai.OpenAI(base_url=f"{BASE}/v1", api_key=key, max_retries=0, timeout=300)


alpha, beta, admin = client(ALPHA), client(BETA), client(ADMIN)


def say(what, value=""):
    print(f"{what}: {value}", flush=True)


def not_found(call, what):
    try:
        call()
    except openai.NotFoundError as error:
        say(f"{what} is not found", error.status_code)
        return
    raise AssertionError(f"{what}: expected 404")


def upload(who, name, lines):
    path = WORK / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with path.open("rb") as f:
        return who.files.create(file=f, purpose="batch")


def line(i):
    return {
        "custom_id": f"r{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "default", "max_tokens": 4,
                 "messages": [{"role": "user", "content": f"Say {i}."}]},
    }


def wait(who, batch_id):
    deadline = time.time() + 300
    while time.time() < deadline:
        batch = who.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.5)
    raise AssertionError(f"{batch_id} did not end")


# Files: each project's own.
alpha_file = upload(alpha, "alpha.jsonl", [line(i) for i in range(3)])
beta_file = upload(beta, "beta.jsonl", [line(i) for i in range(2)])
assert [f.id for f in alpha.files.list()] == [alpha_file.id]
assert [f.id for f in beta.files.list()] == [beta_file.id]
not_found(lambda: beta.files.retrieve(alpha_file.id), "alpha's file, to beta")
not_found(lambda: beta.files.content(alpha_file.id), "alpha's file content, to beta")
not_found(lambda: beta.files.delete(alpha_file.id), "alpha's file deletion, to beta")
not_found(lambda: beta.batches.create(input_file_id=alpha_file.id, endpoint="/v1/chat/completions",
                                      completion_window="24h"), "a batch of alpha's file, to beta")
assert alpha.files.retrieve(alpha_file.id).id == alpha_file.id
admin_files = {f.id for f in admin.files.list()}
assert {alpha_file.id, beta_file.id} <= admin_files, admin_files
say("file lists", "each project its own; the admin both")

# Batches: each project's own, down to their output files.
alpha_batch = alpha.batches.create(input_file_id=alpha_file.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")
beta_batch = beta.batches.create(input_file_id=beta_file.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")
not_found(lambda: beta.batches.retrieve(alpha_batch.id), "alpha's batch, to beta")
not_found(lambda: beta.batches.cancel(alpha_batch.id), "alpha's batch cancellation, to beta")
alpha_done = wait(alpha, alpha_batch.id)
assert alpha_done.status == "completed", alpha_done
assert alpha_done.request_counts.completed == 3, alpha_done.request_counts
not_found(lambda: beta.files.content(alpha_done.output_file_id), "alpha's batch output, to beta")
output = alpha.files.content(alpha_done.output_file_id).text
assert len(output.splitlines()) == 3, output
assert wait(beta, beta_batch.id).status == "completed"
alpha_ids = [b.id for b in alpha.batches.list()]
beta_ids = [b.id for b in beta.batches.list()]
assert alpha_ids == [alpha_batch.id], alpha_ids
assert beta_ids == [beta_batch.id], beta_ids
admin_ids = {b.id for b in admin.batches.list()}
# The admin also sees the job the CLI submitted (the default project's).
assert {alpha_batch.id, beta_batch.id, "batch_1"} <= admin_ids, admin_ids
assert admin.files.content(alpha_done.output_file_id).text == output
say("batch lists", "each project its own; the admin all, the CLI's job too")


# cortex's own job API (what the dashboard reads) holds to the same lines.
def get(path, key):
    request = urllib.request.Request(f"{BASE}{path}", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, None


alpha_job = alpha_batch.id.removeprefix("batch_")
assert [j["batch_id"] for j in get("/v1/jobs", ALPHA)[1]["data"]] == [alpha_batch.id]
assert {alpha_batch.id, beta_batch.id, "batch_1"} <= {j["batch_id"] for j in get("/v1/jobs", ADMIN)[1]["data"]}
for path in (f"/v1/jobs/{alpha_job}", f"/v1/jobs/{alpha_job}/items", f"/v1/jobs/{alpha_job}/items/1"):
    assert get(path, BETA)[0] == 404, path
    assert get(path, ALPHA)[0] == 200, path
request = urllib.request.Request(f"{BASE}/v1/jobs/{alpha_job}/retry", method="POST",
                                 headers={"Authorization": f"Bearer {BETA}"})
try:
    urllib.request.urlopen(request)
    raise AssertionError("beta retried alpha's job")
except urllib.error.HTTPError as error:
    assert error.code == 404, error.code
assert get("/v1/metrics", ALPHA)[0] == 403 and get("/v1/metrics", ADMIN)[0] == 200
say("job API", "each project its own jobs and items; the JSON metrics need an admin key")

# A failed batch (a bad input line) is its project's too.
bad_file = upload(alpha, "bad.jsonl", [line(0), {"custom_id": "x"}])
failed = alpha.batches.create(input_file_id=bad_file.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
assert failed.status == "failed", failed
not_found(lambda: beta.batches.retrieve(failed.id), "alpha's failed batch, to beta")
assert failed.id in [b.id for b in alpha.batches.list()]
assert failed.id not in [b.id for b in beta.batches.list()]

# The admin may act on any project's objects.
admin.files.delete(beta_file.id)
not_found(lambda: beta.files.retrieve(beta_file.id), "beta's file the admin deleted")


def metrics(key):
    request = urllib.request.Request(f"{BASE}/metrics", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


assert metrics(ALPHA) == 403 and metrics(ADMIN) == 200
say("/metrics", "403 to a project key, 200 to the admin")

# The prefix cache: a long prompt is cached for its own project only.
prompt = " ".join(f"word{i}" for i in range(400)) + "\nRepeat the last word."


def cached(who):
    answer = who.completions.create(model="default", prompt=prompt, max_tokens=2, temperature=0)
    return answer.usage.prompt_tokens_details.cached_tokens


assert cached(alpha) == 0
again = cached(alpha)
assert again > 0, f"the same prompt again in one project: {again} cached tokens"
other = cached(beta)
assert other == 0, f"another project's prompt counted {other} cached tokens"
say("prefix cache", f"{again} cached tokens within a project, 0 across")
print("ALL CHECKS PASSED")
