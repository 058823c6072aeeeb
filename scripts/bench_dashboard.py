#!/usr/bin/env python3
"""How fast the dashboard shows a large job, printed (nothing is asserted).

Submits one job of N items (default 100,000 short chats) to a fresh SQLite
queue, lets a worker complete some of them for a few seconds (so the charts
and latencies have data), starts `cortex serve`, and times in Debian's
chromium (headless, driven by Playwright):

  job list   from opening `/` to the job's row shown
  job page   from opening the job to its items table and charts shown
  last page  from the "items" API's last page (offset N-50) to its answer

each the median of R rounds with its spread, and the JSON API behind them
(`/v1/jobs`, `/v1/jobs/1`, a page of items, a `custom_id` search), timed
from outside.

Usage: target/python-env/bin/python scripts/bench_dashboard.py
           [--cortex target/release/cortex] [--items 100000] [--rounds 5]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spread(values):
    return f"median {statistics.median(values) * 1000:7.1f} ms  (min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f}, n={len(values)})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cortex", default="target/release/cortex")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work-seconds", type=float, default=15)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    cortex = str(Path(args.cortex).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, CORTEX_DATA_DIR=f"{tmp}/data", XDG_CONFIG_HOME=f"{tmp}/config")
        for name in ("CORTEX_DB", "CORTEX_MODEL"):
            env.pop(name, None)
        jobs = Path(tmp, "big.jsonl")
        with jobs.open("w") as out:
            for i in range(args.items):
                line = {"custom_id": f"row-{i:06d}", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"messages": [{"role": "user", "content": f"Label {i}: yes or no?"}], "max_tokens": 2}}
                out.write(json.dumps(line) + "\n")
        started = time.perf_counter()
        subprocess.run([cortex, "submit", str(jobs)], env=env, cwd=tmp, check=True, capture_output=True)
        print(f"submit {args.items:,} items: {time.perf_counter() - started:.1f} s")
        worker = subprocess.Popen([cortex, "worker"], env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(args.work_seconds)
        worker.terminate()
        worker.wait()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([cortex, "serve", "--port", str(port), "--batch-parallel", "0"],
                                  env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(url + "/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.2)
            status = json.load(urllib.request.urlopen(f"{url}/v1/jobs/1"))
            counts = status["job"]["counts"]
            print(f"job 1: {counts['total']:,} items, {counts['completed']:,} completed by a worker in {args.work_seconds:.0f} s")

            def timed(path):
                started = time.perf_counter()
                urllib.request.urlopen(url + path).read()
                return time.perf_counter() - started

            last = max(0, args.items - 50)
            for name, path in [("GET /v1/jobs", "/v1/jobs"), ("GET /v1/jobs/1 (with activity)", "/v1/jobs/1"),
                               ("GET items, first page", "/v1/jobs/1/items?limit=50"),
                               (f"GET items, offset {last:,}", f"/v1/jobs/1/items?limit=50&offset={last}"),
                               ("GET items, custom_id search", "/v1/jobs/1/items?custom_id=row-09999&limit=50"),
                               ("GET items, state=completed", "/v1/jobs/1/items?state=completed&limit=50")]:
                print(f"{name:34} {spread([timed(path) for _ in range(args.rounds)])}")

            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
                listing, job_page = [], []
                for _ in range(args.rounds):
                    page = browser.new_page()
                    started = time.perf_counter()
                    page.goto(url + "/")
                    page.wait_for_selector("tr[data-job='1']")
                    listing.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    page.click("tr[data-job='1']")
                    page.wait_for_selector("#items-table tr[data-line='1']")
                    page.wait_for_selector("#job-charts figure")
                    job_page.append(time.perf_counter() - started)
                    page.close()
                browser.close()
            print(f"{'browser: job list shown':34} {spread(listing)}")
            print(f"{'browser: job page shown':34} {spread(job_page)}")
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
