#!/usr/bin/env bash
# Set up .venv with warpforge installed (editable), on a fresh Linux machine with or without a GPU.
#  - CUDA GPU with a CUDA PyTorch + Triton already installed (e.g. a GPU image with no internet):
#    a venv that sees those system packages, warpforge installed without touching them.
#  - otherwise: the pinned CPU test stack (requirements/cpu.txt) plus the dev/bench extras.
# Re-running is cheap: it re-installs only when pyproject.toml, requirements/ or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=$(cat pyproject.toml requirements/*.txt scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f .venv/.stamp ] && [ "$(cat .venv/.stamp)" = "$stamp" ]; then
  exit 0
fi
if $PY -c "import torch, triton, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "setup: CUDA PyTorch found: using it (venv with system site packages)"
  $PY -m venv --system-site-packages .venv
  # --system-site-packages reaches the *base* interpreter's packages; when $PY is itself a venv
  # (the GPU image's python3 is /opt/torch/.venv), a .pth file makes its packages visible too
  site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  $PY -c "import site, sys; sys.prefix != sys.base_prefix and print('\n'.join(site.getsitepackages()))" > "$site/_parent_env.pth"
  .venv/bin/pip install -q --no-deps --no-build-isolation -e .
else
  echo "setup: no CUDA PyTorch here: installing the CPU test stack (kernels will run under the Triton interpreter)"
  $PY -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r requirements/cpu.txt
  .venv/bin/pip install -q -e ".[dev]"
fi
echo "$stamp" > .venv/.stamp
