#!/usr/bin/env bash
# Tests of the Python package (python/fa3c) with pytest.
#
#   tools/test_python.sh [pytest args]
#       CI mode: a fresh venv, pip install numpy ml_dtypes pytest, then `pip install .`
#       of this checkout (builds libfa3c through CMake into the package), then
#       pytest tests/python against the INSTALLED package. torch is not installed:
#       its tests skip with a reason, and so do the transformers model tests
#       (test_transformers_model.py). PyPI's torch for Linux is the CUDA build, about
#       4 GB installed with its nvidia-* wheels: too much for CI's CPU-only run.
#       The library is built with FA3C_CUDA=OFF unless FA3C_CUDA is set: CI has no
#       GPU and the CUDA backend is compiled by the ctest build already, so compiling
#       it again here would only add minutes (FA3C_CUDA=AUTO tools/test_python.sh to
#       build the wheel exactly as a user's `pip install .` would).
#
#   FA3C_LIBRARY=build/libfa3c.so tools/test_python.sh [pytest args]
#       Build-tree mode (e.g. the GPU machine, which has torch but no network): no
#       venv, no install; the current python3 runs pytest with PYTHONPATH=python and
#       that library. The model tests also need transformers in that python3.
#
# Exits non-zero when anything fails, including pytest collecting no test (exit 5).
# -p no:logging: torch.compile logs DEBUG traces that pytest would dump into failure reports.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
py=${PYTHON:-python3}

if [[ -n "${FA3C_LIBRARY:-}" ]]; then
  echo "== fa3c python tests against $FA3C_LIBRARY (source tree python/, $($py --version 2>&1))"
  PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m pytest tests/python -v -rs -p no:logging "$@"
fi

# python3 -m venv needs ensurepip, which Debian ships separately (python3-venv).
if ! "$py" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  echo "== installing python3-venv"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/fa3c-pytest.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "== fresh venv in $work/venv"
"$py" -m venv "$work/venv"
vpy="$work/venv/bin/python"
"$vpy" -m pip install -q --upgrade pip
"$vpy" -m pip install -q numpy ml_dtypes pytest

export FA3C_CUDA=${FA3C_CUDA:-OFF}
echo "== pip install . (FA3C_CUDA=$FA3C_CUDA)"
start=$(date +%s)
if ! "$vpy" -m pip install -v . >"$work/pip-install.log" 2>&1; then
  tail -n 60 "$work/pip-install.log"
  echo "pip install . FAILED" >&2
  exit 1
fi
grep -E "fa3c: CUDA backend|Successfully installed" "$work/pip-install.log" || true
echo "   built and installed in $(( $(date +%s) - start )) s"

# Test the installed package, not the source tree: run from the repo root but with
# no FA3C_LIBRARY, so fa3c and libfa3c.so come from site-packages.
unset FA3C_LIBRARY
export FA3C_EXPECT_INSTALLED=1
"$vpy" -m pytest tests/python -v -rs -p no:logging "$@"
