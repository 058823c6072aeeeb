#!/usr/bin/env bash
# The Python environment of the clients people drive `cortex serve` with
# for tools and evaluation: LangChain (`langchain-openai`, `langchain-ollama`),
# instructor, LiteLLM, the `ollama` package and lm-evaluation-harness
# (`lm-eval[api]`: its API models, no torch), with their own `openai`
# (instructor pins one older than scripts/python-env.sh's). Made once in
# target/clients-env (pip, from the Python package registry); prints the
# interpreter's path.
# Usage: bash scripts/clients-env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
env=target/clients-env
packages=(langchain-openai==1.7.4 langchain-ollama==1.1.0 instructor==1.17.0 litellm==1.110.2 ollama==0.6.3 "lm-eval[api]==0.4.13")
if ! "$env/bin/python" -c "import langchain_openai, langchain_ollama, instructor, litellm, ollama, lm_eval, tenacity, aiohttp" >/dev/null 2>&1; then
    echo "==> clients env: ${packages[*]} into $env" >&2
    rm -rf "$env"
    python3 -m venv "$env" >&2
    "$env/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}" >&2
fi
echo "$PWD/$env/bin/python"
