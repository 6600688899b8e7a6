#!/usr/bin/env python3
"""NumPy reads our DLPack exports: every NumPy-typed tensor of the Python-written fixture files,
exported by safetensors::to_dlpack (through tests/cpp/dlpack_export.cpp, loaded with ctypes) and
imported with numpy.from_dlpack, equals what safetensors.numpy.load_file gives, is read-only, and
is released (the deleter runs) once NumPy drops it.

    dlpack_numpy.py LIBRARY FIXTURE_DIR
"""
import ctypes
import gc
import os
import sys

import numpy as np
from safetensors.numpy import load_file

PyCapsule_New = ctypes.pythonapi.PyCapsule_New
PyCapsule_New.restype = ctypes.py_object
PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
CAPSULE_NAME = b"dltensor_versioned"  # a constant: the capsule keeps pointing at it


class Exported:
    """The producer side of Python's DLPack protocol, over one exported tensor."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU, device 0

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if max_version is None or max_version[0] < 1:
            raise BufferError("only the versioned DLPack ABI is exported")
        ptr, self.ptr = self.ptr, None
        return PyCapsule_New(ptr, CAPSULE_NAME, None)


def main(library, fixtures):
    lib = ctypes.CDLL(library)
    lib.st_export.restype = ctypes.c_void_p
    lib.st_export.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    lib.st_last_error.restype = ctypes.c_char_p
    lib.st_live_exports.restype = ctypes.c_long

    checked = 0
    for file in ("numpy_dtypes.safetensors", "scalars_and_empty.safetensors", "many.safetensors"):
        path = os.path.join(fixtures, file)
        expected = load_file(path)
        for backend in (0, 1):
            for name, want in sorted(expected.items()):
                ptr = lib.st_export(path.encode(), name.encode(), backend)
                if not ptr:
                    sys.exit(f"{file}:{name}: export failed: {lib.st_last_error().decode()}")
                got = np.from_dlpack(Exported(ptr))
                if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want, equal_nan=True):
                    sys.exit(f"{file}:{name}: from_dlpack gave {got.dtype}{got.shape}, expected {want.dtype}{want.shape}")
                if got.size and got.flags.writeable:  # NumPy keeps empty arrays writeable
                    sys.exit(f"{file}:{name}: the array is writeable; exports are read-only")
                del got
                checked += 1
    gc.collect()
    live = lib.st_live_exports()
    if live != 0:
        sys.exit(f"{live} exports were never released: NumPy did not reach our deleter")
    # An unknown tensor is an error, not a crash.
    if lib.st_export(os.path.join(fixtures, "many.safetensors").encode(), b"no such tensor", 0):
        sys.exit("exporting a missing tensor succeeded")
    print(f"ok: {checked} tensors through numpy.from_dlpack, all released; "
          f"missing tensor: {lib.st_last_error().decode()}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
