"""Creates a batch through the official `openai` client and waits for it to
complete; prints its id.

Usage: webhook_batch.py BASE_URL INPUT_FILE
"""

import sys
import time

import openai

base_url, path = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="-")
uploaded = client.files.create(file=open(path, "rb"), purpose="batch")
batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
deadline = time.time() + 120
while batch.status != "completed":
    assert time.time() < deadline and batch.status == "in_progress", batch
    time.sleep(0.3)
    batch = client.batches.retrieve(batch.id)
print(batch.id)
