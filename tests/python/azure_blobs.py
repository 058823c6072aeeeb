"""Blobs on Azurite (Azure Storage's emulator), through azure-storage-blob
(Microsoft's own client), for cortex's object-store tests.

Usage: azure_blobs.py --endpoint URL COMMAND ...
  mkcontainer NAME               creates a container
  put CONTAINER NAME PATH        uploads a local file
  get CONTAINER NAME PATH        downloads a blob
  list CONTAINER                 prints each blob's name as a JSON line
"""

import json
import sys

from azure.storage.blob import BlobServiceClient

# Azurite's well-known development account.
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

args = sys.argv[1:]
endpoint, command, rest = args[1], args[2], args[3:]
service = BlobServiceClient.from_connection_string(
    f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
    f"BlobEndpoint={endpoint}/{ACCOUNT};")
if command == "mkcontainer":
    service.create_container(rest[0])
elif command == "put":
    with open(rest[2], "rb") as data:
        service.get_blob_client(rest[0], rest[1]).upload_blob(data, overwrite=True)
elif command == "get":
    with open(rest[2], "wb") as out:
        out.write(service.get_blob_client(rest[0], rest[1]).download_blob().readall())
elif command == "list":
    for blob in service.get_container_client(rest[0]).list_blobs():
        print(json.dumps({"name": blob.name, "size": blob.size}))
else:
    sys.exit(f"unknown command {command}")
