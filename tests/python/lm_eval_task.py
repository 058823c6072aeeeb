"""lm-evaluation-harness against `cortex serve`: a multiple-choice task
defined from local files, scored with lm-eval's `local-completions` model
as its users run it (the tokenizer found on the server: vLLM's
/tokenizer_info, /tokenize and /detokenize; each choice scored by a
completions request of token ids with echo, logprobs 1 and max_tokens 1).
Then the tokenizer routes' refusals, and one echoed completions request
whose answer the test compares with a batch line's.

Usage: python lm_eval_task.py URL WORKDIR
Prints one JSON object: the accuracy, each question's choice
loglikelihoods, and the echoed request's body and answer.
"""

import json
import os
import pathlib
import sys

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import requests  # noqa: E402
from lm_eval import simple_evaluate  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

url, work = sys.argv[1].rstrip("/"), pathlib.Path(sys.argv[2])

QUESTIONS = [
    ("France", ["Paris", "Madrid", "Tokyo"], 0),
    ("Japan", ["Berlin", "Tokyo", "Cairo"], 1),
    ("Italy", ["Lima", "Oslo", "Rome"], 2),
    ("Germany", ["Berlin", "Nairobi", "Lisbon"], 0),
]
data = work / "capitals.jsonl"
data.write_text(
    "".join(
        json.dumps({"country": c, "choices": [" " + x for x in xs], "answer": a}) + "\n"
        for c, xs, a in QUESTIONS
    )
)
(work / "capitals.yaml").write_text(
    f"""task: cortex_capitals
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: What is the capital city of {{{{country}}}}?\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
)

results = simple_evaluate(
    model="local-completions",
    model_args=f"base_url={url}/v1/completions,model=default,num_concurrent=1,max_retries=1",
    tasks=["cortex_capitals"],
    task_manager=TaskManager(include_path=str(work)),
    log_samples=True,
)
accuracy = results["results"]["cortex_capitals"]["acc,none"]
samples = sorted(results["samples"]["cortex_capitals"], key=lambda s: s["doc_id"])
loglikelihoods = [[r[0][0] for r in s["resps"]] for s in samples]

# The routes a harness leans on refuse what is wrong with a 400 naming it.
refusals = {}
for route, body in [
    ("/tokenize", {"promt": "x"}),
    ("/detokenize", {"tokens": [10**9]}),
]:
    answer = requests.post(url + route, json=body, timeout=60)
    refusals[route] = [answer.status_code, answer.json()["error"]["message"]]

echoed = {
    "model": "default",
    "prompt": "The capital of France is Paris",
    "echo": True,
    "logprobs": 2,
    "max_tokens": 0,
}
answer = requests.post(url + "/v1/completions", json=echoed, timeout=120)
answer.raise_for_status()

print(
    json.dumps(
        {
            "accuracy": accuracy,
            "loglikelihoods": loglikelihoods,
            "refusals": refusals,
            "echoed": {"body": echoed, "answer": answer.json()},
        }
    )
)
