// A Go program on the C API through cgo: writes a file with st_save_file, reads it back (keys,
// infos with zero-copy bytes, a slice, a stream), and checks the error kinds of a missing tensor
// and a missing file. Run by run.sh.
package main

/*
#include <safetensors.h>
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"unsafe"
)

// call runs a C API call with an st_error; a failure becomes a Go error carrying its kind.
type stError struct {
	kind    int
	message string
}

func (e *stError) Error() string {
	return fmt.Sprintf("[%s] %s", C.GoString(C.st_error_kind_name(C.int32_t(e.kind))), e.message)
}

func call(f func(err *C.st_error) C.int) *stError {
	var err C.st_error
	if f(&err) == C.ST_OK {
		return nil
	}
	defer C.st_error_clear(&err)
	return &stError{kind: int(err.kind), message: C.GoStringN(err.message, C.int(err.message_len))}
}

func must(e *stError) {
	if e != nil {
		fmt.Fprintln(os.Stderr, "unexpected failure:", e)
		os.Exit(1)
	}
}

func check(ok bool, what string) {
	if !ok {
		fmt.Fprintln(os.Stderr, "check failed:", what)
		os.Exit(1)
	}
}

func str(s C.st_str) string { return C.GoStringN(s.ptr, C.int(s.len)) }

func main() {
	dir := os.Args[1]
	path := filepath.Join(dir, "go.safetensors")
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))

	// Memory handed to C must not be Go memory that holds Go pointers: the tensors' bytes, names
	// and shapes are copied to C memory first.
	values := []float32{1, 2, 3, 4, 5, 6}
	data := C.malloc(C.size_t(len(values) * 4))
	defer C.free(data)
	copy(unsafe.Slice((*float32)(data), len(values)), values)
	shape := (*C.size_t)(C.malloc(2 * C.size_t(unsafe.Sizeof(C.size_t(0)))))
	defer C.free(unsafe.Pointer(shape))
	dims := unsafe.Slice(shape, 2)
	dims[0], dims[1] = 2, 3
	name := C.CString("w")
	defer C.free(unsafe.Pointer(name))
	t := (*C.st_tensor)(C.calloc(1, C.size_t(unsafe.Sizeof(C.st_tensor{}))))
	defer C.free(unsafe.Pointer(t))
	t.name = C.st_str{ptr: name, len: 1}
	t.dtype = C.ST_DTYPE_F32
	t.rank = 2
	t.shape = shape
	t.data = data
	t.byte_size = C.size_t(len(values) * 4)
	must(call(func(err *C.st_error) C.int { return C.st_save_file(cpath, t, 1, nil, 0, C.ST_SAVE_NO_SYNC, err) }))

	var f *C.st_file
	must(call(func(err *C.st_error) C.int { return C.st_file_open(cpath, C.ST_BACKEND_MMAP, &f, err) }))
	defer C.st_file_free(f)
	var key C.st_str
	must(call(func(err *C.st_error) C.int { return C.st_file_key(f, 0, C.ST_ORDER_SORTED, &key, err) }))
	check(str(key) == "w", "the key is w")
	var info C.st_tensor
	must(call(func(err *C.st_error) C.int { return C.st_file_info(f, key.ptr, key.len, &info, err) }))
	check(info.dtype == C.ST_DTYPE_F32 && info.rank == 2, "dtype and rank")
	got := unsafe.Slice((*float32)(info.data), 6)
	for i, v := range values {
		check(got[i] == v, "zero-copy values")
	}

	// w[1, 1:3] = {5, 6}
	idx := (*[2]C.st_index)(C.calloc(2, C.size_t(unsafe.Sizeof(C.st_index{}))))
	defer C.free(unsafe.Pointer(idx))
	idx[0] = C.st_index{kind: C.ST_INDEX_SELECT, start: 1, step: 1}
	idx[1] = C.st_index{kind: C.ST_INDEX_RANGE, has_start: 1, has_stop: 1, start: 1, stop: 3, step: 1}
	var slice *C.st_slice
	must(call(func(err *C.st_error) C.int { return C.st_file_slice(f, key.ptr, key.len, &idx[0], 2, &slice, err) }))
	defer C.st_slice_free(slice)
	part := C.malloc(8)
	defer C.free(part)
	must(call(func(err *C.st_error) C.int { return C.st_slice_read(slice, part, 8, err) }))
	p := unsafe.Slice((*float32)(part), 2)
	check(p[0] == 5 && p[1] == 6, "slice values")

	var stream *C.st_stream
	must(call(func(err *C.st_error) C.int { return C.st_stream_file(f, nil, 0, 0, 0, &stream, err) }))
	defer C.st_stream_free(stream)
	var item *C.st_stream_tensor
	must(call(func(err *C.st_error) C.int { return C.st_stream_next(stream, &item, err) }))
	check(item != nil, "a streamed tensor")
	var v C.st_tensor
	must(call(func(err *C.st_error) C.int { return C.st_stream_tensor_get(item, &v, nil, nil, err) }))
	check(math.Float32frombits(*(*uint32)(unsafe.Add(v.data, 20))) == 6, "streamed bytes")
	C.st_stream_tensor_free(item)

	missing := C.CString("nope")
	defer C.free(unsafe.Pointer(missing))
	e := call(func(err *C.st_error) C.int { return C.st_file_info(f, missing, 4, &info, err) })
	check(e != nil && e.kind == C.ST_ERR_TENSOR_NOT_FOUND, "a missing tensor is TensorNotFound")
	gone := C.CString(path + ".gone")
	defer C.free(unsafe.Pointer(gone))
	var g *C.st_file
	e = call(func(err *C.st_error) C.int { return C.st_file_open(gone, 0, &g, err) })
	check(e != nil && e.kind == C.ST_ERR_IO, "a missing file is Io")
	fmt.Printf("go: the C API %s works from cgo (%v)\n", C.GoString(C.st_version_string()), e)
}
