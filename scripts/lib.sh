# shellcheck shell=bash
# Shared helpers for scripts/test.sh and scripts/quickstart.sh. Source it, do
# not run it. Everything here is a function or a variable prefixed lamp_/LAMP_.

# The repository root, whatever the caller's working directory.
LAMP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Debian packages every build needs (pkg-config: the packaging.pkg_config
# test; doxygen: the API reference, target docs; the Debian package test
# uses dpkg-deb, which every Debian system has, and dpkg-dev's
# dpkg-shlibdeps, which lamp-tools' Depends come from: without it CPack
# writes the package with none). libopenblas0-openmp:
# Debian's LibTorch runs its FP32 CPU matmuls through the system's
# libblas.so.3, which is otherwise the unoptimised reference BLAS (a GPT
# step in FP32 measured 12.6x slower with it, same losses); the OpenMP
# build shares LibTorch's thread pool instead of adding its own. fortunes:
# train_gpt's default text. libsentencepiece-dev: the SentencePiece
# tokenizer (train_gpt --tokenizer); sentencepiece: its spm_train and
# spm_encode, which docs/gpt.md's command and its test run. libicu-dev:
# the character classes of GPT-2's text split (train_gpt --tokenizer with
# GPT-2's tokenizer files). libzstd-dev: zstd-compressed text (.jsonl.zst
# corpora; gzip needs zlib alone).
# shellcheck disable=SC2034  # used by the scripts that source this file
LAMP_BUILD_PACKAGES=(cmake g++ make libtorch-dev libgloo-dev libcli11-dev
                     libgtest-dev zlib1g-dev nlohmann-json3-dev pkg-config
                     libsentencepiece-dev sentencepiece libicu-dev libzstd-dev
                     doxygen dpkg-dev libopenblas0-openmp fortunes)

# The torch wheel version scripts/test.sh builds against by default: the
# newest on PyPI that lamp is tested with. LAMP_TORCH_VERSION picks another
# (2.11.0, the GPU machines', is tested too; see README's support matrix).
# shellcheck disable=SC2034  # used by the scripts that source this file
LAMP_DEFAULT_TORCH_VERSION=2.15.0
# The wheel `scripts/test.sh --torch both` (CI) builds against by default:
# 2.11.0, the GPU machines' LibTorch (C++17; 2.15's headers demand C++20).
# On a 2-core AMD EPYC, CI's 1.13 plus 2.15 at -O3 ran past its 90 minutes
# (2.15's build 70% done after 1644 s); 2.11 with --fast-build built and
# tested in 2448 s there. Every LibTorch-version switch of
# src/platform/compat.h is at or below 2.11.
# shellcheck disable=SC2034
LAMP_BOTH_TORCH_VERSION=2.11.0

lamp_log() { printf '==> %s\n' "$*" >&2; }
lamp_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Seconds since the epoch, for elapsed-time reports.
lamp_now() { date +%s; }

# All cores of this machine.
lamp_nproc() { nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2; }

# lamp_ensure_packages PKG...: installs the Debian packages that are missing.
# Only runs apt-get when something is missing; without root it prints the
# command to run and exits 1.
lamp_ensure_packages() {
  if ! command -v dpkg >/dev/null 2>&1; then
    lamp_log "dpkg not found: not a Debian system, assuming these are installed: $*"
    return 0
  fi
  local missing=() pkg
  for pkg in "$@"; do
    if ! dpkg -s "$pkg" 2>/dev/null | grep -q '^Status: install ok installed'; then
      missing+=("$pkg")
    fi
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    return 0
  fi
  local install=(apt-get install -y --no-install-recommends "${missing[@]}")
  if [ "$(id -u)" -ne 0 ]; then
    printf 'error: these Debian packages are missing: %s\n' "${missing[*]}" >&2
    printf 'Install them as root, then run this script again:\n' >&2
    printf '  apt-get update && DEBIAN_FRONTEND=noninteractive %s\n' "${install[*]}" >&2
    exit 1
  fi
  lamp_log "Installing missing Debian packages: ${missing[*]}"
  apt-get update
  DEBIAN_FRONTEND=noninteractive "${install[@]}"
}

# lamp_ensure_torch_wheel: makes sure a virtual environment holds PyPI's torch
# wheel (a CUDA-built LibTorch) and sets LAMP_TORCH_WHEEL_ROOT to the LibTorch
# folder inside it. Honours LAMP_TORCH_VERSION (default
# $LAMP_DEFAULT_TORCH_VERSION),
# LAMP_TORCH_VENV (default ~/.cache/lamp/torch-<version>) and LAMP_PYTHON (the
# interpreter that creates the environment, default python3).
lamp_ensure_torch_wheel() {
  local version="${LAMP_TORCH_VERSION:-$LAMP_DEFAULT_TORCH_VERSION}"
  local venv="${LAMP_TORCH_VENV:-$HOME/.cache/lamp/torch-$version}"
  local python="$venv/bin/python"
  local have=""
  if [ -x "$python" ]; then
    have="$("$python" -W ignore -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
  fi
  if [ "$have" != "$version" ]; then
    lamp_log "Installing torch==$version from PyPI into $venv (${have:+found $have; }a few GB)"
    local start
    start="$(lamp_now)"
    if [ ! -x "$python" ]; then
      mkdir -p "$(dirname "$venv")"
      "${LAMP_PYTHON:-python3}" -m venv "$venv"
    fi
    "$venv/bin/pip" install --disable-pip-version-check "torch==$version"
    lamp_log "torch==$version installed in $(( $(lamp_now) - start )) s"
  else
    lamp_log "Using torch $version from $venv"
  fi
  # cudnn-frontend's C++ headers, for BatchNorm folded into the convolutions
  # (cmake/LampCudnn.cmake finds them in <site-packages>/include); only the
  # headers are used, so not its Python dependencies.
  if [ -z "$(find "$venv/lib" -maxdepth 4 -name cudnn_frontend.h -print -quit 2>/dev/null)" ]; then
    lamp_log "Installing nvidia-cudnn-frontend's headers from PyPI into $venv"
    "$venv/bin/pip" install --disable-pip-version-check --no-deps nvidia-cudnn-frontend
  fi
  LAMP_TORCH_WHEEL_ROOT="$("$python" -W ignore -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
  LAMP_TORCH_WHEEL_VERSION="$("$python" -W ignore -c 'import torch; print(torch.__version__)')"
  export LAMP_TORCH_WHEEL_ROOT LAMP_TORCH_WHEEL_VERSION
}

# lamp_ensure_nvcc: the wheel's LibTorch is built with CUDA and its CMake
# config looks for the CUDA toolkit; put /usr/local/cuda/bin on PATH if nvcc is
# not found otherwise.
lamp_ensure_nvcc() {
  if [ -n "${CUDACXX:-}" ] || command -v nvcc >/dev/null 2>&1; then
    return 0
  fi
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
    return 0
  fi
  lamp_die "the torch wheel's LibTorch is built with CUDA and its CMake config needs the CUDA toolkit (nvcc), which was not found on PATH nor in /usr/local/cuda. Install the CUDA toolkit, or set CUDACXX to nvcc's path."
}

# lamp_configure_and_build BUILD_DIR JOBS [CMAKE_ARGS...]: a Release build of
# the repository in BUILD_DIR with JOBS parallel compile jobs.
lamp_configure_and_build() {
  local build="$1" jobs="$2"
  shift 2
  lamp_log "Configuring $build"
  cmake -S "$LAMP_ROOT" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@"
  lamp_log "Building $build with $jobs jobs"
  cmake --build "$build" --parallel "$jobs"
}
