"""Validates cortex's batch output with the official `openai` package.

Usage: python validate_openai.py INPUT.jsonl OUTPUT.jsonl

Each output line's body is validated with the package's own model for the
endpoint its input line named (`ChatCompletion`, `Completion`, `Response`),
and the line itself must have OpenAI's batch output members. Prints one
line per problem and exits 1 if there is any; prints the counts otherwise.
"""

import json
import sys

from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

MODELS = {
    "/v1/chat/completions": ChatCompletion,
    "/v1/completions": Completion,
    "/v1/responses": Response,
}


def main():
    input_path, output_path = sys.argv[1], sys.argv[2]
    urls = {}
    with open(input_path) as f:
        for line in f:
            line = json.loads(line)
            urls[line["custom_id"]] = line["url"]
    problems = []
    counts = {}
    with open(output_path) as f:
        for number, text in enumerate(f, 1):
            line = json.loads(text)
            missing = {"id", "custom_id", "response", "error"} - line.keys()
            if missing:
                problems.append(f"output line {number}: missing {sorted(missing)}")
                continue
            url = urls[line["custom_id"]]
            body = line["response"]["body"]
            try:
                parsed = MODELS[url].model_validate(body)
            except Exception as error:  # pydantic's ValidationError, reported whole
                problems.append(f"output line {number} ({url}): {error}")
                continue
            if url == "/v1/responses" and not parsed.output_text:
                problems.append(f"output line {number}: a response without output_text")
            counts[url] = counts.get(url, 0) + 1
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(1)
    print("valid:", ", ".join(f"{n} {url}" for url, n in sorted(counts.items())))


if __name__ == "__main__":
    main()
