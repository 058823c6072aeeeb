#!/usr/bin/env python3
"""cortex against llama.cpp's own tools, back to back in one run.

1. The engine: `llama-batched-bench` (non-unified KV, its default) against
   `cortex bench` at the same PP/TG/B and threads.
2. Whole jobs: `cortex run FILE` at its defaults against `llama-server`
   (`-np 16` and `-np 64`, non-unified KV) driven by as many concurrent HTTP
   clients as it has slots. Each side gets the same prompts, greedy; the
   token counts both report are printed so the work can be compared.

Prints every time, the ratios and each side's peak memory; `--json FILE`
also writes them as JSON. Run through scripts/bench-peers.sh, which builds
the peers. Nothing here is a test: it only measures.
"""

import argparse
import json
import os
import queue
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

# ---------------------------------------------------------------- workloads

WORDS = (
    "river mountain lantern orchard harbor meadow comet violin glacier canyon "
    "festival library compass thunder garden village engine castle desert forest "
    "island market museum bridge tower valley window winter summer autumn spring "
    "ocean planet rocket silver golden ancient modern quiet bright hidden"
).split()


def sentence(rng, words):
    return " ".join(rng.choice(WORDS) for _ in range(words))


def distinct_job():
    """64 distinct ~32-token prompts, 128 tokens each, EOS ignored."""
    rng = random.Random(1)
    items = []
    for i in range(64):
        prompt = f"Story {i}: the {sentence(rng, 4)} and the {sentence(rng, 3)} were " \
                 f"{sentence(rng, 10)}. Then"
        items.append({"prompt": prompt, "max_tokens": 128, "temperature": 0, "ignore_eos": True})
    return items


def prefix_job():
    """64 prompts sharing a ~490-token prefix, 64 tokens each, EOS ignored."""
    rng = random.Random(2)
    prefix = "Background notes for the archivist. " + " ".join(
        f"Entry {n}: {sentence(rng, 14)}." for n in range(28)
    )
    items = []
    for i in range(64):
        prompt = f"{prefix}\nQuestion {i}: describe the {sentence(rng, 3)}. Answer:"
        items.append({"prompt": prompt, "max_tokens": 64, "temperature": 0, "ignore_eos": True})
    return items


SYSTEMS = [
    "You are a careful assistant for a logistics company. You answer questions about "
    "shipments, warehouses and delivery schedules. Always answer in short paragraphs, "
    "state assumptions explicitly, and never invent tracking numbers. " * 3,
    "You are a support agent for a software product. Be polite, ask for details when a "
    "report is vague, and suggest concrete steps. Keep answers under two hundred words. " * 4,
    "You summarise documents for busy readers. Give the main point first, then up to "
    "three supporting points, then open questions. " * 6,
    "You are a tutor. Explain ideas step by step with small examples and check "
    "understanding with one question at the end. " * 2,
]


def chat_job():
    """A realistic mixed chat job: long system prompts (a few shared ones),
    user messages of varied length, varied max_tokens, EOS allowed (greedy,
    so both sides generate the same text and the work compares)."""
    rng = random.Random(3)
    items = []
    for i in range(96):
        system = SYSTEMS[i % len(SYSTEMS)]
        words = rng.choice([12, 30, 60, 120, 200])
        user = f"Request {i}. {sentence(rng, words)}. What should I do about the " \
               f"{sentence(rng, 2)}?"
        items.append({
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}],
            "max_tokens": rng.choice([48, 96, 160, 256, 400]),
            "temperature": 0,
        })
    return items


def extract_job():
    """Document extraction: 48 long distinct documents (~700-1200 tokens),
    a short question each, short answers, EOS allowed."""
    rng = random.Random(4)
    items = []
    for i in range(48):
        doc = " ".join(f"{sentence(rng, 12)}." for _ in range(rng.randint(45, 80)))
        user = f"Document {i}:\n{doc}\n\nIn one sentence: which place is mentioned first?"
        items.append({"messages": [{"role": "user", "content": user}], "max_tokens": 48,
                      "temperature": 0})
    return items


def short_job():
    """Many small items: 256 short prompts, 16 tokens each (per-item overhead)."""
    rng = random.Random(5)
    return [{"prompt": f"{sentence(rng, 6)}. In short:", "max_tokens": 16, "temperature": 0,
             "ignore_eos": True} for _ in range(256)]


JOBS = {
    "distinct": distinct_job,
    "prefix": prefix_job,
    "chat": chat_job,
    "extract": extract_job,
    "short": short_job,
}

# ---------------------------------------------------------------- helpers


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss_of(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def run_timed(cmd, env=None):
    """Runs a command to completion; returns (seconds, peak RSS bytes, stdout)."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out_chunks = []
    reader = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()))
    reader.start()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    reader.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return seconds, usage.ru_maxrss * 1024, out_chunks[0].decode()


# ---------------------------------------------------------------- engine rows


def batched_bench(peers, model, threads, b, pp=32, tg=128):
    cells = b * ((pp + tg + 32 + 255) // 256 * 256)
    cmd = [f"{peers}/llama-batched-bench", "-m", model, "-c", str(cells), "-b", "2048",
           "-ub", "512", "-npp", str(pp), "-ntg", str(tg), "-npl", str(b),
           "-t", str(threads), "-tb", str(threads)]
    _, rss, out = run_timed(cmd)
    for line in out.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) == 10 and cols[0] == str(pp) and cols[2] == str(b):
            return {"s_pp": float(cols[5]), "s_tg": float(cols[7]), "s": float(cols[9]),
                    "peak_rss_bytes": rss}
    raise RuntimeError(f"no row in llama-batched-bench output:\n{out}")


def cortex_bench(cortex, model, threads, b):
    env = dict(os.environ, CORTEX_MODEL=model, CORTEX_THREADS=str(threads))
    _, rss, out = run_timed([cortex, "bench", "--batch", str(b), "--no-prefix",
                             "--engine-only", "--json"], env)
    row = json.loads(out)["batched"][0]["engine"]
    return {"s_pp": row["s_pp"], "s_tg": row["s_tg"], "s": row["s"], "peak_rss_bytes": rss}


# ---------------------------------------------------------------- whole jobs


def cortex_run(cortex, model, threads, items, extra_env=None):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "job.jsonl")
        with open(path, "w") as f:
            for i, item in enumerate(items):
                f.write(json.dumps({"custom_id": f"r{i}", **item}) + "\n")
        env = dict(os.environ, CORTEX_MODEL=model, CORTEX_THREADS=str(threads),
                   CORTEX_DATA_DIR=os.path.join(tmp, "data"), **(extra_env or {}))
        os.makedirs(env["CORTEX_DATA_DIR"])
        out_path = os.path.join(tmp, "out.jsonl")
        seconds, rss, _ = run_timed([cortex, "run", path, "-o", out_path], env)
        prompt = completion = 0
        with open(out_path) as f:
            for line in f:
                usage = json.loads(line)["response"]["body"]["usage"]
                prompt += usage["prompt_tokens"]
                completion += usage["completion_tokens"]
        return {"seconds": seconds, "peak_rss_bytes": rss, "prompt_tokens": prompt,
                "completion_tokens": completion}


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def server_run(peers, model, threads, items, slots, slot_tokens):
    port = free_port()
    cmd = [f"{peers}/llama-server", "-m", model, "-np", str(slots),
           "-c", str(slots * slot_tokens), "-t", str(threads), "-tb", str(threads),
           "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    errors = []
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not start: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.2)
        work = queue.Queue()
        for item in items:
            work.put(item)
        totals = {"prompt_tokens": 0, "completion_tokens": 0}
        lock = threading.Lock()

        def client():
            while True:
                try:
                    item = work.get_nowait()
                except queue.Empty:
                    return
                body = {"max_tokens": item["max_tokens"], "temperature": 0,
                        "ignore_eos": item.get("ignore_eos", False)}
                if "messages" in item:
                    body["messages"] = item["messages"]
                    url = f"{base}/v1/chat/completions"
                else:
                    body["prompt"] = item["prompt"]
                    url = f"{base}/v1/completions"
                try:
                    usage = post(url, body)["usage"]
                    with lock:
                        totals["prompt_tokens"] += usage["prompt_tokens"]
                        totals["completion_tokens"] += usage["completion_tokens"]
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(str(e))

        started = time.monotonic()
        clients = [threading.Thread(target=client) for _ in range(slots)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        seconds = time.monotonic() - started
        rss = peak_rss_of(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    if errors:
        raise RuntimeError(f"llama-server: {len(errors)} requests failed, e.g. {errors[0]}")
    return {"seconds": seconds, "peak_rss_bytes": rss, **totals}


# ---------------------------------------------------------------- report


def prompt_chars(item):
    if "messages" in item:
        return sum(len(m["content"]) for m in item["messages"])
    return len(item["prompt"])


def mib(b):
    return f"{b / 2**20:7.0f}" if b else "      ?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cortex", required=True)
    parser.add_argument("--peers", required=True, help="directory of llama-batched-bench and llama-server")
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--jobs", default="distinct,prefix,chat,extract,short")
    parser.add_argument("--slots", default="16,64")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    results = {"threads": args.threads, "engine": [], "jobs": []}

    print(f"threads: {args.threads}   model: {args.model}\n")
    batches = [int(b) for b in args.batches.split(",") if b]
    if batches:
        print("engine decode against llama-batched-bench (PP 32, TG 128), tokens/s")
        print("|    B | batched S_TG | cortex S_TG | ratio | batched S_PP | cortex S_PP | ratio | RSS MiB peer/cortex |")
        print("|------|--------------|-------------|-------|--------------|-------------|-------|---------------------|")
    for b in batches:
        log(f"engine: B = {b}")
        peer = batched_bench(args.peers, args.model, args.threads, b)
        ours = cortex_bench(args.cortex, args.model, args.threads, b)
        results["engine"].append({"b": b, "peer": peer, "cortex": ours})
        print(f"| {b:>4} | {peer['s_tg']:>12.1f} | {ours['s_tg']:>11.1f} | {ours['s_tg'] / peer['s_tg']:>5.2f} "
              f"| {peer['s_pp']:>12.1f} | {ours['s_pp']:>11.1f} | {ours['s_pp'] / peer['s_pp']:>5.2f} "
              f"| {mib(peer['peak_rss_bytes'])} / {mib(ours['peak_rss_bytes'])} |", flush=True)

    slots = [int(s) for s in args.slots.split(",") if s]
    jobs = [j for j in args.jobs.split(",") if j]
    if jobs:
        print("\nwhole jobs: `cortex run` (defaults) against llama-server driven by one client per slot")
        print("| job      | side             | seconds | prompt tok | gen tok | RSS MiB | cortex faster by |")
        print("|----------|------------------|---------|------------|---------|---------|------------------|")
    for name in jobs:
        items = JOBS[name]()
        log(f"job {name}: cortex run")
        ours = cortex_run(args.cortex, args.model, args.threads, items)
        row = {"job": name, "items": len(items), "cortex": ours, "peers": {}}
        print(f"| {name:<8} | cortex run       | {ours['seconds']:>7.1f} | {ours['prompt_tokens']:>10} "
              f"| {ours['completion_tokens']:>7} | {mib(ours['peak_rss_bytes'])} |                  |", flush=True)
        # Slots long enough for the longest request (a token is 3+ characters
        # of this English text), in llama.cpp's 256-token granules.
        slot_tokens = min(8192, max(
            (prompt_chars(i) // 3 + 32 + i["max_tokens"] + 255) // 256 * 256 for i in items))
        for n in slots:
            log(f"job {name}: llama-server -np {n}")
            try:
                peer = server_run(args.peers, args.model, args.threads, items, n, slot_tokens)
            except RuntimeError as e:
                # A side that cannot finish the job (requests past the client's
                # timeout) is a result too; the other rows still run.
                row["peers"][f"np{n}"] = {"error": str(e)}
                print(f"| {name:<8} | llama-server -np{n:<2}| failed: {e}", flush=True)
                continue
            row["peers"][f"np{n}"] = peer
            print(f"| {name:<8} | llama-server -np{n:<2}| {peer['seconds']:>7.1f} | {peer['prompt_tokens']:>10} "
                  f"| {peer['completion_tokens']:>7} | {mib(peer['peak_rss_bytes'])} "
                  f"| {peer['seconds'] / ours['seconds']:>15.2f}x |", flush=True)
        results["jobs"].append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
