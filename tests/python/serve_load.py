"""Concurrent streamed chats against an OpenAI-compatible server (cortex
serve, or llama-server for comparison) with the official `openai` client:
every stream must complete with text; prints time to first token
percentiles and throughput.

Usage: serve_load.py BASE_URL CLIENTS MAX_TOKENS [REQUESTS_PER_CLIENT] [API_KEY]
"""

import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai

BASE, CLIENTS, MAX_TOKENS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
PER_CLIENT = int(sys.argv[4]) if len(sys.argv) > 4 else 1
KEY = sys.argv[5] if len(sys.argv) > 5 else "none"
TOPICS = ["the sea", "a robot", "autumn", "a city at night", "bread", "mountains", "a library", "rain"]


def one(client, n):
    """One streamed chat: (time to first token, seconds, tokens, text)."""
    started = time.perf_counter()
    first = None
    parts = []
    tokens = 0
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": f"Write a short story about {TOPICS[n % len(TOPICS)]}."}],
        max_tokens=MAX_TOKENS,
        temperature=0.7,
        seed=n,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.delta.content:
                if first is None:
                    first = time.perf_counter() - started
                parts.append(choice.delta.content)
    return first, time.perf_counter() - started, tokens, "".join(parts)


def client_loop(c):
    client = openai.OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, timeout=600)
    return [one(client, c * PER_CLIENT + k) for k in range(PER_CLIENT)]


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


started = time.perf_counter()
with ThreadPoolExecutor(CLIENTS) as pool:
    results = [r for rs in pool.map(client_loop, range(CLIENTS)) for r in rs]
wall = time.perf_counter() - started
missing = [i for i, (first, _, _, text) in enumerate(results) if first is None or not text]
assert not missing, f"{len(missing)} streams ended without text: {missing[:10]}"
ttft = [r[0] for r in results]
tokens = sum(r[2] for r in results)
print(
    f"clients={CLIENTS} requests={len(results)} max_tokens={MAX_TOKENS} wall={wall:.1f}s "
    f"tokens={tokens} tok/s={tokens / wall:.1f} "
    f"ttft_p50={percentile(ttft, 50) * 1000:.0f}ms ttft_p90={percentile(ttft, 90) * 1000:.0f}ms "
    f"ttft_p99={percentile(ttft, 99) * 1000:.0f}ms ttft_mean={statistics.mean(ttft) * 1000:.0f}ms",
    flush=True,
)
