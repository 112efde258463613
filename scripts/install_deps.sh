#!/usr/bin/env bash
# Installs the Debian packages mambacpp builds against. CUDA (nvcc, cuBLAS) is optional and not installed here: when
# nvcc is on PATH (or in /usr/local/cuda/bin) the CUDA backend is built too. Then the server tests' Node packages
# (tests/server, pinned by its lock file).
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev libhwy-dev
          libpcre2-dev libutf8proc-dev zlib1g-dev libcpp-httplib-dev
          # The Python module (python/) and its tests: Debian's interpreter, headers, pybind11, numpy, pytest, venv.
          python3-dev pybind11-dev python3-numpy python3-pytest python3-venv python3-setuptools python3-wheel python3-pip
          # The scale-out test (tests/deploy) runs nginx (Debian 12: the package with the binary) in front of two servers.
          nginx)
# The server tests run on Node: the machine's node/npm when there are (e.g. NodeSource's nodejs, which conflicts
# with Debian's npm package), else Debian's.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then packages+=(nodejs npm); fi
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

# The OpenAI Node client for tests/server, exactly as its lock file pins it (again only when the lock file changed).
server_tests="$(dirname "$0")/../tests/server"
if [ ! "$server_tests/node_modules/.package-lock.json" -nt "$server_tests/package-lock.json" ]; then
  (cd "$server_tests" && npm ci --no-audit --no-fund --loglevel=error)
fi
