#!/usr/bin/env python3
"""On a GPU: the same greedy job with tokens sampled on the device and on the
host gives the same texts, and a seeded sampling job gives the same texts
with device sampling on and off (it is always sampled on the host). Prints
each run's `--trace` summary (where a step's time went). Exit status 1 when
the texts differ.

Usage: python3 scripts/gpu_check.py --cortex BIN --model GGUF --device cuda0
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

PROMPTS = [
    "Write a haiku about the sea.",
    "List three prime numbers and explain why each is prime.",
    "What is the capital of France? Answer in one sentence.",
    "Summarise the plot of a detective story in two sentences.",
    "Give a recipe for tea.",
    "Explain what a GPU is to a child.",
    "Count from one to ten in words.",
    "Describe a sunset over the mountains.",
]


def run(cortex, model, device, items, on_device, tmp, name):
    path = os.path.join(tmp, f"{name}.jsonl")
    with open(path, "w") as f:
        for i, item in enumerate(items):
            f.write(json.dumps({"custom_id": f"r{i}", **item}) + "\n")
    env = dict(os.environ, CORTEX_MODEL=model, CORTEX_DEVICE=device,
               CORTEX_DATA_DIR=os.path.join(tmp, f"data-{name}"),
               CORTEX_SAMPLE_ON_DEVICE="true" if on_device else "false")
    out = os.path.join(tmp, f"{name}.out.jsonl")
    trace = os.path.join(tmp, f"{name}.trace.jsonl")
    proc = subprocess.run([cortex, "run", path, "-o", out, "--trace", trace], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"cortex run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    summary = [line for line in proc.stderr.splitlines()
               if line.startswith("trace:") or line.startswith("  ")]
    texts = {}
    with open(out) as f:
        for line in f:
            row = json.loads(line)
            body = row["response"]["body"]
            choice = body["choices"][0]
            texts[row["custom_id"]] = choice.get("text") or choice.get("message", {}).get("content")
    return texts, "\n".join(summary)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cortex", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--repeat", type=int, default=4, help="each prompt this many times")
    args = parser.parse_args()
    greedy = [{"messages": [{"role": "user", "content": p}], "max_tokens": 64, "temperature": 0}
              for p in PROMPTS] * args.repeat
    seeded = [{"prompt": p, "max_tokens": 32, "temperature": 0.8, "top_p": 0.9, "seed": 7}
              for p in PROMPTS]
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for label, items in [("greedy", greedy), ("seeded", seeded)]:
            host, host_trace = run(args.cortex, args.model, args.device, items, False, tmp,
                                   f"{label}-host")
            device, device_trace = run(args.cortex, args.model, args.device, items, True, tmp,
                                       f"{label}-device")
            differ = [k for k in host if host[k] != device.get(k)]
            print(f"{label}: {len(host)} items, {len(differ)} differ between host and device "
                  f"sampling", flush=True)
            for k in differ[:3]:
                print(f"  {k}: host {host[k]!r}\n  {' ' * len(k)}  device {device[k]!r}")
            print(f"  sampled on the host:\n{host_trace}\n  on the device:\n{device_trace}",
                  flush=True)
            failed = failed or bool(differ)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
