#!/usr/bin/env python3
"""The real all-MiniLM-L6-v2 model read through the C API from Python's ctypes, compared with
Python's safetensors 0.8.0: the same keys (sorted and in file order), metadata, dtypes, shapes
and bytes, for every tensor, zero-copy from the mapping and read with the read backend; a slice
of each 2-D tensor against NumPy's slicing; and the errors' kinds.

    minilm_ctypes.py LIBSAFETENSORS_SO MODEL_CACHE_DIR

Exit 77 (skipped) when the model has not been fetched (the fixture needs the network)."""
import ctypes as C
import os
import sys

import numpy as np
from safetensors import safe_open

ST_OK = 0
ST_BACKEND_MMAP, ST_BACKEND_READ = 0, 1
ST_ORDER_SORTED, ST_ORDER_FILE = 0, 1
ST_INDEX_RANGE = 0
ST_ERR_TENSOR_NOT_FOUND, ST_ERR_IO, ST_ERR_INTERNAL = 10, 14, 20


class Str(C.Structure):
    _fields_ = [("ptr", C.c_void_p), ("len", C.c_size_t)]

    def bytes(self):
        return C.string_at(self.ptr, self.len)


class Error(C.Structure):
    _fields_ = [("kind", C.c_int32), ("message", C.c_char_p), ("message_len", C.c_size_t)]


class Tensor(C.Structure):
    _fields_ = [("name", Str), ("dtype", C.c_int32), ("rank", C.c_size_t), ("shape", C.POINTER(C.c_size_t)),
                ("data", C.c_void_p), ("byte_size", C.c_size_t), ("data_begin", C.c_uint64),
                ("data_end", C.c_uint64)]


class FileDesc(C.Structure):
    _fields_ = [("tensor_count", C.c_size_t), ("backend", C.c_uint32), ("in_memory", C.c_bool),
                ("has_metadata", C.c_bool), ("metadata_count", C.c_size_t), ("header_len", C.c_uint64),
                ("data_len", C.c_uint64), ("trailing_bytes", C.c_uint64), ("bytes_read", C.c_uint64),
                ("path", Str)]


class Index(C.Structure):
    _fields_ = [("kind", C.c_uint32), ("has_start", C.c_uint8), ("has_stop", C.c_uint8), ("start", C.c_int64),
                ("stop", C.c_int64), ("step", C.c_int64)]


NUMPY = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
         "U8": np.uint8, "I8": np.int8, "BOOL": np.bool_}


class Library:
    def __init__(self, path):
        self.lib = lib = C.CDLL(path)
        P = C.POINTER
        sigs = {
            "st_file_open": [C.c_char_p, C.c_uint32, P(C.c_void_p), P(Error)],
            "st_file_describe": [C.c_void_p, P(FileDesc), P(Error)],
            "st_file_key": [C.c_void_p, C.c_size_t, C.c_uint32, P(Str), P(Error)],
            "st_file_info": [C.c_void_p, C.c_void_p, C.c_size_t, P(Tensor), P(Error)],
            "st_file_read": [C.c_void_p, C.c_void_p, C.c_size_t, C.c_void_p, C.c_size_t, P(Error)],
            "st_file_metadata": [C.c_void_p, C.c_size_t, P(Str), P(Str), P(Error)],
            "st_file_slice": [C.c_void_p, C.c_void_p, C.c_size_t, P(Index), C.c_size_t, P(C.c_void_p), P(Error)],
            "st_slice_tensor": [C.c_void_p, P(Tensor), P(Error)],
            "st_slice_read": [C.c_void_p, C.c_void_p, C.c_size_t, P(Error)],
        }
        for name, args in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, C.c_int
        for name in ("st_file_free", "st_slice_free", "st_error_clear"):
            getattr(lib, name).restype = None
        lib.st_file_free.argtypes = [C.c_void_p]
        lib.st_slice_free.argtypes = [C.c_void_p]
        lib.st_error_clear.argtypes = [P(Error)]
        lib.st_dtype_name.argtypes, lib.st_dtype_name.restype = [C.c_int32], C.c_char_p
        lib.st_version.restype = C.c_uint32
        lib.st_version_string.restype = C.c_char_p

    def call(self, name, *args):
        """Calls `name`; returns None on success, else (kind, message)."""
        err = Error()
        rc = getattr(self.lib, name)(*args, C.byref(err))
        if rc == ST_OK:
            return None
        outcome = (err.kind, err.message.decode() if err.message else "")
        self.lib.st_error_clear(C.byref(err))
        return outcome

    def ok(self, name, *args):
        failed = self.call(name, *args)
        if failed:
            raise AssertionError(f"{name} failed: {failed}")


def shape_of(t):
    return tuple(t.shape[i] for i in range(t.rank))


def main(lib_path, cache):
    model = os.path.join(cache, "model.safetensors")
    if not os.path.exists(model):
        print(f"skipped: {model} is missing (the minilm fixture fetches it from PyPI)")
        return 77
    st = Library(lib_path)
    v = st.lib.st_version()
    assert st.lib.st_version_string().decode() == f"{v >> 16}.{(v >> 8) & 0xff}.{v & 0xff}"
    with safe_open(model, framework="numpy") as ref:
        ref_keys = list(ref.keys())
        ref_meta = ref.metadata() or {}
        reference = {k: ref.get_tensor(k) for k in ref_keys}
    checked = 0
    for backend in (ST_BACKEND_MMAP, ST_BACKEND_READ):
        f = C.c_void_p()
        st.ok("st_file_open", model.encode(), backend, C.byref(f))
        d = FileDesc()
        st.ok("st_file_describe", f, C.byref(d))
        assert d.tensor_count == len(ref_keys) and d.backend == backend, (d.tensor_count, len(ref_keys))
        assert os.path.getsize(model) == 8 + d.header_len + d.data_len
        keys, offsets = [], []
        for i in range(d.tensor_count):
            s = Str()
            st.ok("st_file_key", f, i, ST_ORDER_SORTED, C.byref(s))
            keys.append(s.bytes().decode())
        assert keys == sorted(ref_keys), "sorted keys differ from Python's"
        meta = {}
        for i in range(d.metadata_count):
            k, v = Str(), Str()
            st.ok("st_file_metadata", f, i, C.byref(k), C.byref(v))
            meta[k.bytes().decode()] = v.bytes().decode()
        assert meta == ref_meta, (meta, ref_meta)
        for i in range(d.tensor_count):
            s = Str()
            st.ok("st_file_key", f, i, ST_ORDER_FILE, C.byref(s))
            t = Tensor()
            st.ok("st_file_info", f, s.ptr, s.len, C.byref(t))
            offsets.append(t.data_begin)
        assert offsets == sorted(offsets), "file order is not data-offset order"
        for name in keys:
            want = reference[name]
            t = Tensor()
            st.ok("st_file_info", f, name.encode(), len(name.encode()), C.byref(t))
            dtype = st.lib.st_dtype_name(t.dtype).decode()
            assert np.dtype(NUMPY[dtype]) == want.dtype, (name, dtype, want.dtype)
            assert shape_of(t) == want.shape, (name, shape_of(t), want.shape)
            assert t.byte_size == want.nbytes
            if backend == ST_BACKEND_MMAP:
                got = np.frombuffer(C.string_at(t.data, t.byte_size), dtype=want.dtype).reshape(want.shape)
            else:
                assert t.data is None, "the read backend has no zero-copy bytes"
                buf = C.create_string_buffer(t.byte_size)
                st.ok("st_file_read", f, name.encode(), len(name.encode()), buf, t.byte_size)
                got = np.frombuffer(buf.raw, dtype=want.dtype).reshape(want.shape)
            assert np.array_equal(got, want), f"{name}: bytes differ from Python's"
            if len(want.shape) == 2 and want.shape[1] >= 4:
                # [:, 1:4], as NumPy slices it.
                idx = (Index * 2)(Index(ST_INDEX_RANGE, False, False, 0, 0, 1), Index(ST_INDEX_RANGE, True, True, 1, 4, 1))
                sl = C.c_void_p()
                st.ok("st_file_slice", f, name.encode(), len(name.encode()), idx, 2, C.byref(sl))
                part = Tensor()
                st.ok("st_slice_tensor", sl, C.byref(part))
                buf = C.create_string_buffer(part.byte_size)
                st.ok("st_slice_read", sl, buf, part.byte_size)
                got = np.frombuffer(buf.raw, dtype=want.dtype).reshape(shape_of(part))
                st.lib.st_slice_free(sl)  # after its shape was read: the slice owns it
                assert np.array_equal(got, want[:, 1:4]), f"{name}[:, 1:4] differs from NumPy's"
            checked += 1
        kind, message = st.call("st_file_info", f, b"no such tensor", 14, C.byref(Tensor()))
        assert kind == ST_ERR_TENSOR_NOT_FOUND and "no such tensor" in message, (kind, message)
        st.lib.st_file_free(f)
    kind, message = st.call("st_file_open", model.encode() + b".missing", 0, C.byref(C.c_void_p()))
    assert kind == ST_ERR_IO and ".missing" in message, (kind, message)
    kind, _ = st.call("st_file_describe", None, C.byref(FileDesc()))
    assert kind == ST_ERR_INTERNAL
    print(f"ctypes: {checked} tensors of {os.path.basename(model)} equal Python's safetensors, both backends")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
