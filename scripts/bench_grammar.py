#!/usr/bin/env python3
"""The cost of grammar-constrained decoding, printed (nothing is asserted).

Runs the same extraction prompts through `cortex run` three ways, each on a
fresh database, greedy, same max_tokens:

  free       no constraint
  schema     response_format json_schema (the draw is checked against the
             grammar; only a rejected draw masks the vocabulary)
  masked     json_schema with logprobs, which masks the whole vocabulary
             before every draw (the worst case)

and prints generated tokens, wall seconds and tokens/s for each (the whole
job: model load, prefill and decode), with the ratio to `free`.

Usage: python3 scripts/bench_grammar.py [--cortex target/release/cortex] [--items 128]
"""

import argparse
import json
import os
import subprocess
import tempfile
import time

SCHEMAS = [
    (
        "Extract the person: Maria Lopez is 34 years old, reach her at maria@example.com.",
        {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0},
            "email": {"type": ["string", "null"], "maxLength": 60}},
         "required": ["name", "age", "email"], "additionalProperties": False},
    ),
    (
        "Turn this into an order: order 1182, two widgets (W-1) at 3.50 each and one gadget (G-7) at 12.",
        {"type": "object", "properties": {
            "id": {"type": "integer"},
            "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object", "properties": {
                    "sku": {"type": "string", "maxLength": 12},
                    "qty": {"type": "integer", "minimum": 1},
                    "price": {"type": "number"}},
                "required": ["sku", "qty", "price"], "additionalProperties": False}},
            "status": {"enum": ["pending", "shipped", "delivered"]}},
         "required": ["id", "items", "status"], "additionalProperties": False},
    ),
    (
        "Analyse this review: The blender is powerful and quiet, but the lid cracked after a week.",
        {"type": "object", "properties": {
            "sentiment": {"enum": ["positive", "negative", "neutral"]},
            "score": {"type": "number"},
            "keywords": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4}},
         "required": ["sentiment", "score", "keywords"], "additionalProperties": False},
    ),
]


def job(variant, items, max_tokens):
    lines = []
    for i in range(items):
        prompt, schema = SCHEMAS[i % len(SCHEMAS)]
        # A distinct first sentence per item, so no prompt is shared whole.
        body = {
            "messages": [
                {"role": "system", "content": f"Request {i}. Reply with JSON only."},
                {"role": "user", "content": prompt},
            ],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        if variant != "free":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": f"s{i % len(SCHEMAS)}", "strict": True, "schema": schema},
            }
        if variant == "masked":
            body["logprobs"] = True
        lines.append(json.dumps({"custom_id": f"b-{i}", "method": "POST",
                                 "url": "/v1/chat/completions", "body": body}))
    return "\n".join(lines) + "\n"


def run(cortex, variant, items, max_tokens, workdir):
    path = os.path.join(workdir, f"{variant}.jsonl")
    with open(path, "w") as f:
        f.write(job(variant, items, max_tokens))
    db = os.path.join(workdir, f"{variant}.db")
    out = os.path.join(workdir, f"{variant}.out.jsonl")
    started = time.monotonic()
    subprocess.run([cortex, "run", path, "--db", db, "-o", out], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.monotonic() - started
    tokens = 0
    parsed = 0
    with open(out) as f:
        for line in f:
            body = json.loads(line)["response"]["body"]
            tokens += body["usage"]["completion_tokens"]
            try:
                json.loads(body["choices"][0]["message"]["content"])
                parsed += 1
            except ValueError:
                pass
    return tokens, seconds, parsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cortex", default="target/release/cortex")
    parser.add_argument("--items", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        rows = []
        for variant in ["free", "schema", "masked"]:
            rows.append((variant, *run(args.cortex, variant, args.items, args.max_tokens, workdir)))
    base = rows[0][1] / rows[0][2]
    print(f"grammar cost: {args.items} chat items, greedy, max_tokens {args.max_tokens} (cortex run, whole job)")
    print(f"{'variant':8} {'tokens':>7} {'seconds':>8} {'tok/s':>7} {'vs free':>8} {'valid JSON':>11}")
    for variant, tokens, seconds, parsed in rows:
        rate = tokens / seconds
        print(f"{variant:8} {tokens:7d} {seconds:8.1f} {rate:7.1f} {rate / base:8.2f} {parsed:5d}/{args.items}")


if __name__ == "__main__":
    main()
