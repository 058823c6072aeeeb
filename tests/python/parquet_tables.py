"""Parquet files as pyarrow (the Arrow project's own Python library) writes
and reads them, for cortex's table input and output.

Usage:
  parquet_tables.py plain PATH N        a table of N rows: id (int64), text (string)
  parquet_tables.py batch PATH N        OpenAI batch columns, body as JSON text
  parquet_tables.py wrong-type PATH     a column `messages` of numbers
  parquet_tables.py read PATH           prints the table's rows as JSON lines
"""

import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq

TOPICS = ["the sea", "a robot", "autumn", "bread", "mountains", "rain", "a library", "a city at night"]

command, path = sys.argv[1], sys.argv[2]
if command == "plain":
    n = int(sys.argv[3])
    pq.write_table(pa.table({"id": pa.array([100 + i for i in range(n)], pa.int64()),
                             "text": [TOPICS[i % len(TOPICS)] for i in range(n)]}), path)
elif command == "batch":
    n = int(sys.argv[3])
    bodies = [json.dumps({"messages": [{"role": "user", "content": f"Write one sentence about {TOPICS[i % len(TOPICS)]}."}],
                          "max_tokens": 8, "temperature": 0}) for i in range(n)]
    pq.write_table(pa.table({"custom_id": [f"row-{i}" for i in range(n)], "method": ["POST"] * n,
                             "url": ["/v1/chat/completions"] * n, "body": bodies}), path)
elif command == "wrong-type":
    pq.write_table(pa.table({"custom_id": ["a", "b"], "messages": pa.array([1, 2], pa.int64())}), path)
elif command == "read":
    table = pq.read_table(path)
    print(json.dumps({"schema": {f.name: str(f.type) for f in table.schema}}))
    for row in table.to_pylist():
        print(json.dumps(row))
