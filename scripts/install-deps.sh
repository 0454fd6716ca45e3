#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian 12 packages kvxfer needs to build, test and benchmark.
# Idempotent: packages already present are skipped, and apt is not touched
# at all when nothing is missing. It touches apt and nothing else (no pip, no
# downloads).
set -euo pipefail

packages=(
  build-essential g++ cmake make pkg-config git ccache
  libucx-dev ucx-utils
  libgtest-dev libgmock-dev libbenchmark-dev
  libssl-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  python3-dev python3-pybind11 pybind11-dev python3-numpy python3-pytest
  python3-prometheus-client
  clang libclang-rt-14-dev clang-format
  iproute2 procps gnuplot-nox iperf3
  python3-venv python3-setuptools python3-wheel python3-pip dpkg-dev file lintian
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
