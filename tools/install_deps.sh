#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks to build and test flowedge (C++ side), by package name.
set -euo pipefail
pkgs=(cmake g++ make git libeigen3-dev doctest-dev catch2 nlohmann-json3-dev libcli11-dev python3 python3-venv
      g++-aarch64-linux-gnu qemu-user)  # the last two: the aarch64 cross build and its emulated run (tools/test_aarch64.sh)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
echo "flowedge: build dependencies present"
