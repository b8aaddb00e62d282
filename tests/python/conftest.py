"""Shared setup for the Python tests.

Runs against the installed fa3c package (tools/test_python.sh) or, during
development, against the source tree: PYTHONPATH=python
FA3C_LIBRARY=build/libfa3c.so pytest tests/python. When fa3c is not importable
at all, python/ of this checkout is used as a last resort.
"""
import os
import sys
import zlib

import numpy as np
import pytest

try:
    import fa3c  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import fa3c  # noqa: F401


def pytest_report_header(config):
    try:
        lib = fa3c.library_path()
        extra = "libfa3c %s at %s, CUDA backend usable: %s" % (fa3c.version(), lib, fa3c.cuda_available())
    except OSError as e:
        extra = "libfa3c not loadable: %s" % e
    return ["fa3c package: %s" % os.path.dirname(fa3c.__file__), extra]


@pytest.fixture
def rng(request):
    # a fresh, reproducible stream per test
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


def ml_dtypes_or_skip():
    return pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (bf16/fp8 numpy arrays)")
