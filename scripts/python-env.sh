#!/usr/bin/env bash
# The Python environment the tests check cortex with: the official `openai`
# package, whose types validate cortex's output lines and which drives
# `cortex serve`, the official `ollama` package, `prometheus_client`,
# whose parser reads /metrics (real clients, not copies of their shapes), and
# Schemathesis, which fuzzes every route from `/openapi.json`, and Playwright,
# which drives Debian's chromium through the dashboard, and `standardwebhooks`, which
# checks the signatures of cortex's webhook events, and `pyarrow`, which writes and
# reads the Parquet tables cortex takes and gives, and `boto3`, AWS's own S3 client, which puts
# and lists the objects of the object-store tests, and `azure-storage-blob`, Microsoft's own client,
# which does the same on Azurite, and `transformers` (with `jinja2`), Hugging Face's chat-template
# renderer, the reference cortex's templates are compared with, and `gguf`, llama.cpp's GGUF writer, which
# makes the tiny random-weight models of real architectures the tests run. Made once in target/python-env (pip, from the Python
# package registry); prints the interpreter's path.
# Usage: bash scripts/python-env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
env=target/python-env
packages=(openai==3.54.0 ollama==0.6.3 prometheus-client==0.26.0 schemathesis==4.32.5 playwright==1.65.2 standardwebhooks==1.1.0 pyarrow==22.0.0 boto3==1.44.8 azure-storage-blob==12.31.1 transformers==5.24.0 jinja2==3.1.6 gguf==0.19.0)
if ! "$env/bin/python" -c "import openai, ollama, prometheus_client, schemathesis, playwright, standardwebhooks, pyarrow, boto3, azure.storage.blob, transformers, jinja2, gguf" >/dev/null 2>&1; then
    echo "==> python env: ${packages[*]} into $env" >&2
    rm -rf "$env"
    python3 -m venv "$env" >&2
    "$env/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}" >&2
fi
echo "$PWD/$env/bin/python"
