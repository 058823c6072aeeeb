"""Validates cortex's batch output with the official `openai` package.

Usage: python validate_openai.py INPUT.jsonl OUTPUT.jsonl

Each output line's body is validated with the package's own model for the
endpoint its input line named (`ChatCompletion`, `Completion`, `Response`,
`CreateEmbeddingResponse`; base64 embeddings are decoded first, as the
client does), and the line itself must have OpenAI's batch output members. Prints one
line per problem and exits 1 if there is any; prints the counts otherwise.
"""

import base64
import json
import struct
import sys

from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

MODELS = {
    "/v1/chat/completions": ChatCompletion,
    "/v1/completions": Completion,
    "/v1/responses": Response,
    "/v1/embeddings": CreateEmbeddingResponse,
}


def decode_base64_embeddings(body):
    """The body with each base64 embedding (little-endian float32) as a list."""
    for item in body.get("data", []):
        if isinstance(item.get("embedding"), str):
            raw = base64.b64decode(item["embedding"])
            item["embedding"] = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return body


def main():
    input_path, output_path = sys.argv[1], sys.argv[2]
    urls = {}
    base64_ids = set()
    with open(input_path) as f:
        for line in f:
            line = json.loads(line)
            urls[line["custom_id"]] = line["url"]
            if line["body"].get("encoding_format") == "base64":
                base64_ids.add(line["custom_id"])
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
            if line["custom_id"] in base64_ids:
                if not all(isinstance(d["embedding"], str) for d in body["data"]):
                    problems.append(f"output line {number}: base64 asked for, numbers given")
                body = decode_base64_embeddings(body)
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
