"""Objects on an S3-compatible server, through boto3 (AWS's own client), for
cortex's object-store tests.

Usage: s3_objects.py --endpoint URL --keys ACCESS:SECRET COMMAND ...
  put BUCKET KEY PATH      uploads a local file
  get BUCKET KEY PATH      downloads an object
  list BUCKET              prints each key and size as a JSON line
  uploads BUCKET           prints the multipart uploads in progress (count)
"""

import json
import sys

import boto3

args = sys.argv[1:]
endpoint, keys = args[1], args[3]
access, secret = keys.split(":", 1)
command, rest = args[4], args[5:]
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access,
                  aws_secret_access_key=secret, region_name="us-east-1")
if command == "put":
    s3.upload_file(rest[2], rest[0], rest[1])
elif command == "get":
    s3.download_file(rest[0], rest[1], rest[2])
elif command == "list":
    for item in s3.list_objects_v2(Bucket=rest[0]).get("Contents", []):
        print(json.dumps({"key": item["Key"], "size": item["Size"]}))
elif command == "uploads":
    print(len(s3.list_multipart_uploads(Bucket=rest[0]).get("Uploads", [])))
else:
    sys.exit(f"unknown command {command}")
