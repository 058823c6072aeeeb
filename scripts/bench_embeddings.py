#!/usr/bin/env python3
"""Embedding throughput, printed (nothing is asserted).

Runs N short inputs (default 10,000 sentences of about 12 tokens) through
`cortex run` as /v1/embeddings batch lines, two ways, each on a fresh database:

  per-line   one input per line (N lines): the engine packs the inputs of
             many items into each decode
  64-a-line  64 inputs per line (N/64 lines)

and prints inputs/s and tokens/s for the whole job (model load, submit,
export included). With --llama-server PATH it also runs llama.cpp's own
server (`--embeddings --pooling mean`, the same model, threads and batch
size) on the same inputs, 64 per request from 4 concurrent clients, and
prints its inputs/s the same way (server start excluded).

Usage: python3 scripts/bench_embeddings.py [--cortex target/release/cortex]
           [--inputs 10000] [--llama-server target/peers/build-Release/bin/llama-server]
"""

import argparse
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

ADJECTIVES = ["quiet", "bright", "heavy", "small", "ancient", "curious", "broken", "golden"]
NOUNS = ["river", "engine", "garden", "letter", "market", "mountain", "violin", "harbour"]
VERBS = ["crosses", "follows", "hides", "repairs", "paints", "watches", "carries", "finds"]


def sentence(i):
    a = ADJECTIVES[i % 8]
    n = NOUNS[(i // 8) % 8]
    v = VERBS[(i // 64) % 8]
    m = NOUNS[(i // 512) % 8]
    return f"Note {i}: the {a} {n} {v} the {m} near town."


def job(inputs, per_line):
    lines = []
    for start in range(0, inputs, per_line):
        batch = [sentence(i) for i in range(start, min(start + per_line, inputs))]
        body = {"model": "default", "input": batch[0] if per_line == 1 else batch}
        lines.append(json.dumps({"custom_id": f"e-{start}", "method": "POST",
                                 "url": "/v1/embeddings", "body": body}))
    return "\n".join(lines) + "\n"


def run_cortex(cortex, inputs, per_line, workdir):
    name = f"per{per_line}"
    path = os.path.join(workdir, f"{name}.jsonl")
    with open(path, "w") as f:
        f.write(job(inputs, per_line))
    db = os.path.join(workdir, f"{name}.db")
    out = os.path.join(workdir, f"{name}.out.jsonl")
    started = time.monotonic()
    subprocess.run([cortex, "run", path, "--db", db, "-o", out], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.monotonic() - started
    vectors = tokens = 0
    with open(out) as f:
        for line in f:
            body = json.loads(line)["response"]["body"]
            vectors += len(body["data"])
            tokens += body["usage"]["prompt_tokens"]
    return vectors, tokens, seconds


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_llama_server(binary, model, inputs, threads):
    port = free_port()
    server = subprocess.Popen(
        [binary, "-m", model, "--embeddings", "--pooling", "mean", "--port", str(port),
         "-t", str(threads), "-c", "8192", "-b", "2048", "-ub", "2048", "-np", "4"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        chunks = [[sentence(i) for i in range(s, min(s + 64, inputs))] for s in range(0, inputs, 64)]
        counts = {"vectors": 0, "tokens": 0}
        lock = threading.Lock()

        def client(mine):
            for chunk in mine:
                request = urllib.request.Request(
                    url + "/v1/embeddings", data=json.dumps({"input": chunk}).encode(),
                    headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=600) as r:
                    body = json.load(r)
                with lock:
                    counts["vectors"] += len(body["data"])
                    counts["tokens"] += body["usage"]["prompt_tokens"]

        started = time.monotonic()
        threads_ = [threading.Thread(target=client, args=(chunks[k::4],)) for k in range(4)]
        for t in threads_:
            t.start()
        for t in threads_:
            t.join()
        return counts["vectors"], counts["tokens"], time.monotonic() - started
    finally:
        server.terminate()
        server.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cortex", default="target/release/cortex")
    parser.add_argument("--inputs", type=int, default=10000)
    parser.add_argument("--llama-server")
    parser.add_argument("--model", help="a GGUF (default: the default model, from `cortex models pull`)")
    args = parser.parse_args()
    if args.model is None:
        args.model = subprocess.run([args.cortex, "models", "pull"], check=True,
                                    capture_output=True, text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for per_line in [1, 64]:
            label = "per-line" if per_line == 1 else "64-a-line"
            rows.append((f"cortex {label}", *run_cortex(args.cortex, args.inputs, per_line, workdir)))
    if args.llama_server:
        rows.append(("llama-server", *run_llama_server(args.llama_server, args.model, args.inputs,
                                                       os.cpu_count())))
    print(f"embeddings: {args.inputs} short inputs, default model ({os.cpu_count()} cores)")
    print(f"{'run':22} {'vectors':>8} {'tokens':>8} {'seconds':>8} {'inputs/s':>9} {'tok/s':>8}")
    for label, vectors, tokens, seconds in rows:
        print(f"{label:22} {vectors:8d} {tokens:8d} {seconds:8.1f} {vectors / seconds:9.1f} {tokens / seconds:8.1f}")


if __name__ == "__main__":
    main()
