#!/usr/bin/env bash
# Installs the Debian packages cubesim builds against, and only those that are missing.
# Idempotent: a second run installs nothing. Needs root (or sudo) for apt-get.
set -euo pipefail

pkgs=(
  build-essential cmake make git
  libboost-context-dev libeigen3-dev libfmt-dev nlohmann-json3-dev libgtest-dev
  pybind11-dev python3-dev python3-numpy python3-pytest
  libopenblas-dev pkg-config
  openmpi-bin python3-mpi4py python3-matplotlib python3-yaml
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} Debian packages present"
  exit 0
fi

echo "install-deps: missing: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo)
else
  echo "install-deps: not root and no password-less sudo. Run this once as root, then retry:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: installed ${missing[*]}"
