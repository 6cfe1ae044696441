#!/usr/bin/env bash
# setup.sh: install what a fresh Debian 12 / Ubuntu 24.04 needs (apt-get) and build megatrain.
# CUDA is used when nvcc is found (PATH or /usr/local/cuda); the CUDA toolkit itself is not installed here.
# Env: BUILD_DIR (default build), MEGATRAIN_CUDA (AUTO|ON|OFF), SKIP_APT=1 to skip package installation.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
PACKAGES=(build-essential cmake ninja-build pkg-config git libcli11-dev libyaml-cpp-dev libspdlog-dev
          nlohmann-json3-dev catch2 libopenmpi-dev openmpi-bin libopenblas-dev libicu-dev libsentencepiece-dev sentencepiece)

if [[ "${SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if ((${#missing[@]})); then
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  # node + npm for the GPT-2 tokenizer test (it fetches the reference encoder with npm).
  if ! command -v npm >/dev/null; then
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
  fi
  # Chromium (headless) for the report test: it renders the page and checks the plots in a screenshot.
  if ! command -v chromium >/dev/null; then
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium
  fi
  # PyTorch for the HuggingFace export test (HF's modeling code written out in PyTorch).
  if ! python3 -c "import torch" 2>/dev/null && ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-torch
  fi
fi

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRAIN_CUDA="${MEGATRAIN_CUDA:-AUTO}" \
  -DMEGATRAIN_WERROR="${MEGATRAIN_WERROR:-OFF}"
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "setup: built $BUILD_DIR/bin/megatrain"
