#!/usr/bin/env python3
"""cortex against llama.cpp's own tools, in interleaved rounds in one run.

1. The engine: `llama-batched-bench` (non-unified KV, its default) against
   `cortex bench` at the same PP/TG/B and threads.
2. Whole jobs: `cortex run FILE` at its defaults against `llama-server`
   (`-np 16` and `-np 64`, non-unified KV) driven by as many concurrent HTTP
   clients as it has slots. Each side gets the same prompts, greedy; the
   token counts both report are printed so the work can be compared.

These machines swing by ±15% from run to run, so every measurement runs
`--rounds` times, the sides taking turns (cortex, peer, peer, cortex, ...),
and the tables give the median of each with its spread (min-max); ratios
are of medians. `--device` runs both sides on a GPU (cortex's `--device`,
the peers' `-ngl 99`); `--scale K` repeats each job's items K times with
fresh prompts (to keep a GPU busy). Where `nvidia-smi` exists the GPU's
mean utilisation during each run is printed too.

Prints every time, the ratios and each side's peak memory; `--json FILE`
also writes them as JSON. Run through scripts/bench-peers.sh (or
scripts/gpu-kit.sh bench), which builds the peers. Nothing here is a test:
it only measures.
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


def classify_job():
    """Short classification: 400 reviews, one instruction shared by all (a
    chat with a fixed system prompt), answers of a word or two, EOS allowed."""
    rng = random.Random(6)
    system = ("You label customer reviews. Read the review and answer with exactly one word: "
              "positive, negative or neutral. Do not explain.")
    items = []
    for i in range(400):
        review = f"{sentence(rng, rng.choice([8, 15, 30, 60]))}. The {sentence(rng, 2)} was " \
                 f"{rng.choice(['great', 'awful', 'fine', 'late', 'broken', 'perfect'])}."
        items.append({"messages": [{"role": "system", "content": system},
                                   {"role": "user", "content": f"Review {i}: {review}"}],
                      "max_tokens": 4, "temperature": 0})
    return items


def summarise_job():
    """Summaries of long documents: 24 distinct documents of ~1,500-2,500
    tokens, up to 160 tokens of summary each, EOS allowed."""
    rng = random.Random(7)
    items = []
    for i in range(24):
        doc = " ".join(f"{sentence(rng, 14)}." for _ in range(rng.randint(60, 100)))
        items.append({"messages": [{"role": "user", "content":
                                    f"Summarise this report in three sentences.\n\n{doc}"}],
                      "max_tokens": 160, "temperature": 0})
    return items


def documents_job():
    """The usual job of a data team at a big model's pace: 16 distinct
    documents of ~512 tokens, 64 tokens of answer each, EOS ignored."""
    rng = random.Random(8)
    items = []
    for i in range(16):
        doc = " ".join(f"{sentence(rng, 13)}." for _ in range(34))
        items.append({"prompt": f"Document {i}:\n{doc}\n\nThe main point of document {i} is",
                      "max_tokens": 64, "temperature": 0, "ignore_eos": True})
    return items


JOBS = {
    "distinct": distinct_job,
    "prefix": prefix_job,
    "chat": chat_job,
    "extract": extract_job,
    "short": short_job,
    "classify": classify_job,
    "summarise": summarise_job,
    "documents": documents_job,
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


class GpuSampler:
    """Mean GPU utilisation while it runs, from nvidia-smi (if there is one)."""

    def __init__(self):
        self.proc = None
        self.samples = []
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 "-lms", "200"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.reader = threading.Thread(target=self._read, daemon=True)
            self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.samples.append(float(line.split(",")[0]))
            except ValueError:
                pass

    def stop(self):
        if self.proc is None:
            return None
        self.proc.terminate()
        self.proc.wait()
        return sum(self.samples) / len(self.samples) if self.samples else None


def run_timed(cmd, env=None, stderr_into=None):
    """Runs a command to completion; returns (seconds, peak RSS bytes, stdout).
    `stderr_into`, a list, gets its standard error."""
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
    if stderr_into is not None:
        stderr_into.append(err.decode())
    return seconds, usage.ru_maxrss * 1024, out_chunks[0].decode()


# ---------------------------------------------------------------- engine rows


# Set from the command line: the device both sides run on ("cpu" or a GPU's
# name), which the peers take as -ngl.
DEVICE = "cpu"


def peer_gpu_args():
    return [] if DEVICE == "cpu" else ["-ngl", "99"]


def cortex_env(model, threads, extra=None):
    env = dict(os.environ, CORTEX_MODEL=model, CORTEX_THREADS=str(threads), CORTEX_DEVICE=DEVICE)
    env.update(extra or {})
    return env


def batched_bench(peers, model, threads, b, pp=32, tg=128):
    cells = b * ((pp + tg + 32 + 255) // 256 * 256)
    cmd = [f"{peers}/llama-batched-bench", "-m", model, "-c", str(cells), "-b", "2048",
           "-ub", "512", "-npp", str(pp), "-ntg", str(tg), "-npl", str(b),
           "-t", str(threads), "-tb", str(threads), *peer_gpu_args()]
    _, rss, out = run_timed(cmd)
    for line in out.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) == 10 and cols[0] == str(pp) and cols[2] == str(b):
            return {"s_pp": float(cols[5]), "s_tg": float(cols[7]), "s": float(cols[9]),
                    "peak_rss_bytes": rss}
    raise RuntimeError(f"no row in llama-batched-bench output:\n{out}")


def cortex_bench(cortex, model, threads, b, extra_env=None, pp=32, tg=128):
    env = cortex_env(model, threads, extra_env)
    # (The shape flags only when asked: a build before them has no such flags.)
    shape = [] if (pp, tg) == (32, 128) else ["--pp", str(pp), "--tg", str(tg)]
    _, rss, out = run_timed([cortex, "bench", "--batch", str(b), "--no-prefix",
                             "--engine-only", "--json", *shape], env)
    row = json.loads(out)["batched"][0]["engine"]
    return {"s_pp": row["s_pp"], "s_tg": row["s_tg"], "s": row["s"], "peak_rss_bytes": rss}


# ---------------------------------------------------------------- whole jobs


def cortex_run(cortex, model, threads, items, extra_env=None, trace=False):
    """`cortex run` on the job; with `trace`, also its `--trace` summary
    (where the job's time went), which costs a little time."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "job.jsonl")
        with open(path, "w") as f:
            for i, item in enumerate(items):
                f.write(json.dumps({"custom_id": f"r{i}", **item}) + "\n")
        env = cortex_env(model, threads, dict(CORTEX_DATA_DIR=os.path.join(tmp, "data"),
                                              **(extra_env or {})))
        os.makedirs(env["CORTEX_DATA_DIR"])
        out_path = os.path.join(tmp, "out.jsonl")
        gpu = GpuSampler()
        cmd = [cortex, "run", path, "-o", out_path]
        stderr = []
        if trace:
            cmd += ["--trace", os.path.join(tmp, "trace.jsonl")]
        seconds, rss, _ = run_timed(cmd, env, stderr_into=stderr)
        utilisation = gpu.stop()
        prompt = completion = 0
        with open(out_path) as f:
            for line in f:
                usage = json.loads(line)["response"]["body"]["usage"]
                prompt += usage["prompt_tokens"]
                completion += usage["completion_tokens"]
        result = {"seconds": seconds, "peak_rss_bytes": rss, "prompt_tokens": prompt,
                  "completion_tokens": completion, "gpu_utilisation": utilisation}
        if trace:
            result["trace"] = "\n".join(
                line for line in stderr[0].splitlines()
                if line.startswith("trace:") or (line.startswith("  ") and "every step" not in line))
        return result


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def server_metrics(base):
    """llama-server's /metrics counters (with `--metrics`), by name."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()
    figures = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, _, value = line.partition(" ")
            figures[name.removeprefix("llamacpp:")] = float(value)
    return figures


def server_run(peers, model, threads, items, slots, slot_tokens, timeline=False):
    """llama-server with `slots` slots, one client per slot; with `timeline`,
    also what its /metrics and the responses' `timings` say of the work."""
    port = free_port()
    cmd = [f"{peers}/llama-server", "-m", model, "-np", str(slots),
           "-c", str(slots * slot_tokens), "-t", str(threads), "-tb", str(threads),
           "--host", "127.0.0.1", "--port", str(port), "--no-webui", *peer_gpu_args()]
    if timeline:
        cmd.append("--metrics")
    # Its log goes to a file: a pipe nobody reads fills up after a few
    # hundred requests and stalls the server.
    log_file = tempfile.TemporaryFile()
    launched = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log_file)
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
                log_file.seek(0)
                raise RuntimeError(f"llama-server did not start: {log_file.read().decode()[-2000:]}")
            time.sleep(0.2)
        work = queue.Queue()
        for item in items:
            work.put(item)
        totals = {"prompt_tokens": 0, "completion_tokens": 0}
        # From each response's `timings`: prompt tokens computed and reused.
        timings = {"prompt_n": 0, "cache_n": 0, "prompt_ms": 0.0, "predicted_ms": 0.0}
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
                    answer = post(url, body)
                    usage = answer["usage"]
                    with lock:
                        totals["prompt_tokens"] += usage["prompt_tokens"]
                        totals["completion_tokens"] += usage["completion_tokens"]
                        for key in timings:
                            timings[key] += answer.get("timings", {}).get(key, 0)
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(str(e))

        started = time.monotonic()
        gpu = GpuSampler()
        clients = [threading.Thread(target=client) for _ in range(slots)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        seconds = time.monotonic() - started
        utilisation = gpu.stop()
        rss = peak_rss_of(proc.pid)
        metrics = server_metrics(base) if timeline else None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log_file.close()
    if errors:
        raise RuntimeError(f"llama-server: {len(errors)} requests failed, e.g. {errors[0]}")
    # Its start (loading the model until /health answers, to the 0.2 s
    # it is polled at) is not in `seconds`; cortex's own start is in its.
    result = {"seconds": seconds, "start_seconds": started - launched, "peak_rss_bytes": rss,
              "gpu_utilisation": utilisation, **totals}
    if timeline:
        result["timeline"] = server_timeline(metrics, timings, totals, seconds)
    return result


def server_timeline(metrics, timings, totals, seconds):
    """llama-server's side of "where the time goes", in the terms of
    cortex's trace summary: decode calls (steps), tokens and sequences per
    decode, prompt tokens computed against those sent, time in prompt
    processing and in generation (summed over slots, so overlapping)."""
    decodes = metrics.get("n_decode_total", 0) or 1
    prompt = metrics.get("prompt_tokens_total", 0)
    generated = metrics.get("tokens_predicted_total", 0)
    return (f"llama-server: {metrics.get('n_decode_total', 0):.0f} decode calls in {seconds:.1f} s; "
            f"{(prompt + generated) / decodes:.1f} tokens per decode, "
            f"{metrics.get('n_busy_slots_per_decode', 0):.1f} busy slots per decode\n"
            f"  prompt tokens computed {timings['prompt_n']} of {totals['prompt_tokens']} sent "
            f"({timings['cache_n']} from a slot's cache); "
            f"prompt processing {metrics.get('prompt_seconds_total', 0):.1f} s and generation "
            f"{metrics.get('tokens_predicted_seconds_total', 0):.1f} s summed over slots")


# ---------------------------------------------------------------- report


def prompt_chars(item):
    if "messages" in item:
        return sum(len(m["content"]) for m in item["messages"])
    return len(item["prompt"])


def mib(b):
    return f"{b / 2**20:7.0f}" if b else "      ?"


def scaled(items, scale):
    """The job's items `scale` times, each copy's prompts made distinct (so
    nothing is answered from a copy) by a leading copy number."""
    if scale <= 1:
        return items
    out = []
    for k in range(scale):
        for item in items:
            copy = json.loads(json.dumps(item))
            if "prompt" in copy:
                copy["prompt"] = f"[{k}] {copy['prompt']}"
            else:
                copy["messages"][-1]["content"] = f"[{k}] {copy['messages'][-1]['content']}"
            out.append(copy)
    return out


def median(values):
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def summary(values):
    """'median (min-max)' of a list of numbers."""
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def interleaved(rounds, sides):
    """Runs each (name, fn) `rounds` times, taking turns and swapping who
    goes first each round; returns name -> list of results (None where a
    side failed, with why logged)."""
    results = {name: [] for name, _ in sides}
    for r in range(rounds):
        order = sides if r % 2 == 0 else list(reversed(sides))
        for name, fn in order:
            log(f"  round {r + 1}/{rounds}: {name}")
            try:
                results[name].append(fn())
            except RuntimeError as e:
                log(f"  {name} failed: {e}")
                results[name].append({"error": str(e)})
    return results


def ok(runs):
    return [r for r in runs if "error" not in r]


def main():
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cortex", required=True)
    parser.add_argument("--peers", required=True, help="directory of llama-batched-bench and llama-server")
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="the peers' threads, and cortex's on the CPU")
    parser.add_argument("--cortex-threads", type=int,
                        help="cortex's threads (default: --threads on the CPU; on a GPU 0, "
                             "cortex's own choice for the device)")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--pp", type=int, default=32, help="prompt tokens a sequence in the engine rows")
    parser.add_argument("--tg", type=int, default=128, help="tokens a sequence generates in the engine rows")
    parser.add_argument("--fixed-counts", action="store_true",
                        help="every job item ignores EOS, so both sides generate every max_tokens "
                             "(for random-weight models, whose EOS falls anywhere)")
    parser.add_argument("--job-items", default="",
                        help="the first K items of some jobs, e.g. summarise=8,chat=32 (big models on few cores)")
    parser.add_argument("--max-tokens", type=int,
                        help="at most this many tokens an item generates, in every job")
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--slots", default="16,64")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per measurement")
    parser.add_argument("--device", default="cpu", help="cpu, or a GPU both sides run on (e.g. cuda0)")
    parser.add_argument("--scale", type=int, default=1, help="repeat each job's items this many times")
    parser.add_argument("--engine-rounds", type=int, help="rounds of the engine rows (default: --rounds)")
    parser.add_argument("--job-slots", default="",
                        help="llama-server slots for some jobs instead of --slots, e.g. distinct=256,chat=64")
    parser.add_argument("--job-scale", default="",
                        help="--scale for some jobs, e.g. chat=6,prefix=8")
    parser.add_argument("--variant", action="append", default=[],
                        help="one more cortex side with settings in its environment, "
                             "NAME:VAR=VALUE[,VAR=VALUE] (e.g. b1024:CORTEX_BATCH_TOKENS=1024); repeatable")
    parser.add_argument("--compare", help="another cortex binary (e.g. an earlier build) "
                        "measured in the same rounds, as 'cortex before'")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--timelines", action="store_true",
                        help="after each job's rounds, one more (untimed) run of each side "
                             "saying where its time went: cortex's --trace summary, "
                             "llama-server's /metrics and response timings")
    parser.add_argument("--engine-variants", action="store_true",
                        help="measure the --variant sides in the engine decode rows too")
    parser.add_argument("--variants-traced-only", action="store_true",
                        help="run the --variant sides only in --timelines (one traced run each), "
                             "not in the timed rounds")
    parser.add_argument("--timelines-cortex-only", action="store_true",
                        help="with --timelines, trace cortex's runs only (no llama-server runs)")
    args = parser.parse_args()
    DEVICE = args.device
    cortex_threads = args.cortex_threads
    if cortex_threads is None:
        cortex_threads = args.threads if args.device == "cpu" else 0
    results = {"threads": args.threads, "cortex_threads": cortex_threads, "device": args.device,
               "rounds": args.rounds,
               "engine": [], "jobs": []}

    print(f"threads: {args.threads} (cortex: {cortex_threads or 'for the device'})   "
          f"device: {args.device}   model: {args.model}   "
          f"rounds: {args.rounds} (medians, min-max)\n")
    variants = []
    for spec in args.variant:
        name, _, settings = spec.partition(":")
        variants.append((name, dict(pair.split("=", 1) for pair in settings.split(",") if pair)))
    batches = [int(b) for b in args.batches.split(",") if b]
    if batches:
        print(f"engine decode against llama-batched-bench (PP {args.pp}, TG {args.tg}), tokens/s")
        # S: the whole row's tokens over its whole time. Where cortex runs
        # several step loops, one loop's first decode steps overlap another's
        # prompts, which moves time from its TG phase into its PP phase: S
        # is the ratio those two shares cannot skew.
        print("|    B | batched S_TG | cortex S_TG | ratio | batched S_PP | cortex S_PP | ratio "
              "| S ratio | RSS MiB peer/cortex |")
        print("|------|--------------|-------------|-------|--------------|-------------|-------"
              "|---------|---------------------|")
    for b in batches:
        log(f"engine: B = {b}")
        sides = [
            ("peer", lambda b=b: batched_bench(args.peers, args.model, args.threads, b, args.pp, args.tg)),
            ("cortex", lambda b=b: cortex_bench(args.cortex, args.model, cortex_threads, b,
                                                pp=args.pp, tg=args.tg)),
        ]
        if args.compare:
            sides.append(("before", lambda b=b: cortex_bench(args.compare, args.model, cortex_threads, b,
                                                             pp=args.pp, tg=args.tg)))
        for variant, env in (variants if args.engine_variants else []):
            sides.append((variant, lambda b=b, env=env: cortex_bench(
                args.cortex, args.model, cortex_threads, b, env, pp=args.pp, tg=args.tg)))
        runs = interleaved(args.engine_rounds or args.rounds, sides)
        peer, ours = ok(runs["peer"]), ok(runs["cortex"])
        results["engine"].append({"b": b, **runs})
        save(args.json, results)
        if not peer or not ours:
            for side, side_runs in runs.items():
                good = ok(side_runs)
                figures = (f"S_TG {summary([r['s_tg'] for r in good])}, "
                           f"S_PP {summary([r['s_pp'] for r in good])}") if good else \
                    f"failed: {side_runs[0]['error'][:80]}"
                print(f"| {b:>4} | {side}: {figures} |", flush=True)
            continue
        tg = lambda rs: [r["s_tg"] for r in rs]
        pp = lambda rs: [r["s_pp"] for r in rs]
        whole = lambda rs: [r["s"] for r in rs]
        print(f"| {b:>4} | {summary(tg(peer)):>12} | {summary(tg(ours)):>11} "
              f"| {median(tg(ours)) / median(tg(peer)):>5.2f} "
              f"| {summary(pp(peer)):>12} | {summary(pp(ours)):>11} "
              f"| {median(pp(ours)) / median(pp(peer)):>5.2f} "
              f"| {median(whole(ours)) / median(whole(peer)):>7.2f} "
              f"| {mib(max(r['peak_rss_bytes'] for r in peer))} / "
              f"{mib(max(r['peak_rss_bytes'] for r in ours))} |", flush=True)
        others = ["before"] + [variant for variant, _ in variants]
        for side in others:
            theirs = ok(runs.get(side, []))
            if theirs:
                print(f"|      | cortex {side}: S_TG {summary(tg(theirs))}, "
                      f"now/{side} {median(tg(ours)) / median(tg(theirs)):.2f}; "
                      f"S_PP {summary(pp(theirs))}, now/{side} {median(pp(ours)) / median(pp(theirs)):.2f}; "
                      f"S now/{side} {median(whole(ours)) / median(whole(theirs)):.2f} |",
                      flush=True)

    slots = [int(s) for s in args.slots.split(",") if s]
    job_slots = {k: [int(v)] for k, v in (pair.split("=") for pair in args.job_slots.split(",") if pair)}
    job_scale = {k: int(v) for k, v in (pair.split("=") for pair in args.job_scale.split(",") if pair)}
    job_items = {k: int(v) for k, v in (pair.split("=") for pair in args.job_items.split(",") if pair)}
    jobs = [j for j in args.jobs.split(",") if j]
    if jobs:
        print("\nwhole jobs: `cortex run` (defaults) against llama-server driven by one client per slot; seconds")
        print("| job      | items | side               | seconds median (min-max) | prompt tok | gen tok | RSS MiB | GPU % | cortex faster by |")
        print("|----------|-------|--------------------|--------------------------|------------|---------|---------|-------|------------------|")
    for name in jobs:
        items = scaled(JOBS[name](), job_scale.get(name, args.scale))
        items = items[:job_items.get(name, len(items))]
        for item in items:
            if args.fixed_counts:
                item["ignore_eos"] = True
            if args.max_tokens:
                item["max_tokens"] = min(item["max_tokens"], args.max_tokens)
        # Slots long enough for the longest request (a token is 3+ characters
        # of this English text), in llama.cpp's 256-token granules.
        slot_tokens = min(8192, max(
            (prompt_chars(i) // 3 + 32 + i["max_tokens"] + 255) // 256 * 256 for i in items))
        sides = [("cortex run", lambda: cortex_run(args.cortex, args.model, cortex_threads, items))]
        for variant, env in ([] if args.variants_traced_only else variants):
            sides.append((f"cortex {variant}", lambda env=env: cortex_run(
                args.cortex, args.model, cortex_threads, items, extra_env=env)))
        if args.compare:
            sides.append(("cortex before", lambda: cortex_run(args.compare, args.model, cortex_threads,
                                                              items)))
        for n in job_slots.get(name, slots):
            sides.append((f"llama-server -np{n}", lambda n=n: server_run(
                args.peers, args.model, args.threads, items, n, slot_tokens)))
        log(f"job {name}: {len(items)} items")
        runs = interleaved(args.rounds, sides)
        results["jobs"].append({"job": name, "items": len(items), "runs": runs})
        save(args.json, results)
        ours = ok(runs["cortex run"])
        ours_median = median([r["seconds"] for r in ours]) if ours else None
        for side, side_runs in runs.items():
            good = ok(side_runs)
            if not good:
                print(f"| {name:<8} | {len(items):>5} | {side:<18} | failed: {side_runs[0]['error'][:60]}",
                      flush=True)
                continue
            seconds = [r["seconds"] for r in good]
            gpu = [r["gpu_utilisation"] for r in good if r.get("gpu_utilisation") is not None]
            gpu_text = f"{median(gpu):5.0f}" if gpu else "    -"
            faster = "" if side == "cortex run" or ours_median is None else \
                f"{median(seconds) / ours_median:>15.2f}x"
            print(f"| {name:<8} | {len(items):>5} | {side:<18} | {summary(seconds):>24} "
                  f"| {good[0]['prompt_tokens']:>10} | {good[0]['completion_tokens']:>7} "
                  f"| {mib(max(r['peak_rss_bytes'] or 0 for r in good))} | {gpu_text} | {faster:>16} |",
                  flush=True)
            # cortex's seconds hold its start (the model's load); llama-server's
            # hold only its work: its start is said apart, and the ratio with it
            # (what a user who starts a server for the job waits).
            starts = [r["start_seconds"] for r in good if "start_seconds" in r]
            if starts:
                with_start = "" if ours_median is None else \
                    f"; with it cortex is faster by {(median(seconds) + median(starts)) / ours_median:.2f}x"
                print(f"|          |       | {side:<18} | start {summary(starts):>18} s (loading until "
                      f"healthy: not in its seconds above{with_start}) |", flush=True)
        if args.timelines:
            log(f"job {name}: timelines")
            ours = cortex_run(args.cortex, args.model, cortex_threads, items, trace=True)
            print(f"\nwhere the time goes, job {name} (one untimed run each):\n"
                  f"cortex run ({ours['seconds']:.1f} s with --trace)\n{ours['trace']}")
            for variant, env in variants:
                theirs = cortex_run(args.cortex, args.model, cortex_threads, items, extra_env=env,
                                    trace=True)
                print(f"cortex {variant} ({theirs['seconds']:.1f} s with --trace)\n{theirs['trace']}")
            if not args.timelines_cortex_only:
                for n in job_slots.get(name, slots):
                    peer = server_run(args.peers, args.model, args.threads, items, n, slot_tokens,
                                      timeline=True)
                    print(f"-np {n} ({peer['seconds']:.1f} s): {peer['timeline']}")
            print(flush=True)
            results["jobs"][-1]["timelines"] = {"cortex": ours}
            save(args.json, results)
    save(args.json, results)


def save(path, results):
    """The figures so far, rewritten after each measurement (a run cut off
    keeps what it measured)."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
