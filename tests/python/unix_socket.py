"""The official `openai` client over `cortex serve --unix-socket`: an httpx
transport on the socket, nothing else changed.

Usage: unix_socket.py SOCKET_PATH
"""

import sys

import httpx
import openai

SOCKET = sys.argv[1]
transport = httpx.HTTPTransport(uds=SOCKET)
client = openai.OpenAI(base_url="http://localhost/v1", api_key="unused", max_retries=0, timeout=120,
                       http_client=httpx.Client(transport=transport))
models = [m.id for m in client.models.list()]
assert models, models
answer = client.chat.completions.create(model="default", max_tokens=4, temperature=0,
                                        messages=[{"role": "user", "content": "Say hi."}])
assert answer.choices[0].message.content, answer
assert answer.usage.completion_tokens > 0, answer.usage
# Any name in Host: no web page can reach a Unix socket, so no DNS rebinding.
other = openai.OpenAI(base_url="http://cortex.internal/v1", api_key="unused", max_retries=0,
                      timeout=120, http_client=httpx.Client(transport=transport))
assert [m.id for m in other.models.list()] == models
print("models:", models)
print("ALL CHECKS PASSED")
