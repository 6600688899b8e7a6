/* Every entry point of the C API from a C99 program: files with every backend and in memory,
 * keys in both orders, infos with zero-copy bytes, metadata, slices and their byte runs,
 * checkpoints (strict and lenient), conversion and dequantization, writing, streams, prefetch,
 * advice, upload plans, and the careless calls (NULL handles, unknown flags), each with the
 * result or the error kind it must give.
 *
 *   c_api_test WORK_DIR */
#include "support.h"

#include <unistd.h>

#include <stdint.h>

static const char* work;
static char fixture[4096];

static const float b_values[6] = {0, 1, 2, 3, 4, 5};
static const unsigned char a_values[4] = {1, 2, 3, 4};
static const int64_t s_value = 7;
static const unsigned char n_value = 9;
static const unsigned char f4_values[3] = {0x21, 0x43, 0x65};
static const size_t b_shape[2] = {2, 3};
static const size_t a_shape[1] = {4};
static const size_t e_shape[1] = {0};
static const size_t n_shape[1] = {1};
static const size_t f4_shape[2] = {2, 3};

/* "n\0ul" holds a NUL: names are (pointer, length) pairs. */
static const char nul_name[] = "n\0ul";
#define NUL_NAME nul_name, 4

static st_tensor tensor(const char* name, size_t name_len, int32_t dtype, size_t rank, const size_t* shape,
                        const void* data, size_t size) {
  st_tensor t;
  memset(&t, 0, sizeof t);
  t.name.ptr = name;
  t.name.len = name_len;
  t.dtype = dtype;
  t.rank = rank;
  t.shape = shape;
  t.data = data;
  t.byte_size = size;
  return t;
}

static size_t fixture_tensors(st_tensor* out) {
  out[0] = tensor(ST_LITERAL("b"), ST_DTYPE_F32, 2, b_shape, b_values, sizeof b_values);
  out[1] = tensor(ST_LITERAL("a"), ST_DTYPE_U8, 1, a_shape, a_values, sizeof a_values);
  out[2] = tensor(ST_LITERAL("s"), ST_DTYPE_I64, 0, NULL, &s_value, sizeof s_value);
  out[3] = tensor(ST_LITERAL("e"), ST_DTYPE_F16, 1, e_shape, NULL, 0);
  out[4] = tensor(NUL_NAME, ST_DTYPE_U8, 1, n_shape, &n_value, 1);
  out[5] = tensor(ST_LITERAL("f4"), ST_DTYPE_F4, 2, f4_shape, f4_values, sizeof f4_values);
  return 6;
}

static st_metadata_entry entry(const char* key, const char* value) {
  st_metadata_entry e;
  e.key.ptr = key;
  e.key.len = strlen(key);
  e.value.ptr = value;
  e.value.len = strlen(value);
  return e;
}

/* The names in sorted and in file order (dtype descending, then name: how the writer lays out). */
static const char* const sorted_names[6] = {"a", "b", "e", "f4", "n", "s"};
static const char* const file_names[6] = {"s", "b", "e", "a", "n", "f4"};

static int name_is(st_str s, const char* expected) {
  if (strcmp(expected, "n") == 0) return s.len == 4 && memcmp(s.ptr, nul_name, 4) == 0;
  return str_is(s, expected);
}

static void test_names_and_version(void) {
  int32_t dtype = -1;
  int k;
  char version[32];
  CHECK(st_version() == ST_VERSION);
  snprintf(version, sizeof version, "%d.%d.%d", ST_VERSION_MAJOR, ST_VERSION_MINOR, ST_VERSION_PATCH);
  CHECK(strcmp(st_version_string(), version) == 0);
  CHECK(strcmp(st_dtype_name(ST_DTYPE_F8_E4M3), "F8_E4M3") == 0);
  CHECK(strcmp(st_dtype_name(ST_DTYPE_U64), "U64") == 0);
  CHECK(strcmp(st_dtype_name(22), "") == 0 && strcmp(st_dtype_name(-1), "") == 0);
  CHECK(st_dtype_bits(ST_DTYPE_F4) == 4 && st_dtype_bits(ST_DTYPE_F6_E2M3) == 6 &&
        st_dtype_bits(ST_DTYPE_C64) == 64);
  CHECK(st_dtype_bits(99) == 0);
  OK(st_dtype_from_name(ST_LITERAL("BF16"), &dtype, err));
  CHECK(dtype == ST_DTYPE_BF16);
  FAILS(ST_ERR_TYPE_MISMATCH, st_dtype_from_name(ST_LITERAL("bf16"), &dtype, err));
  for (k = 0; k <= ST_ERR_BUDGET_EXCEEDED; ++k) CHECK(strlen(st_error_kind_name(k)) > 0);
  CHECK(strcmp(st_error_kind_name(ST_ERR_IO), "Io") == 0);
  CHECK(strcmp(st_error_kind_name(ST_ERR_INVALID_HEADER_DESERIALIZATION), "InvalidHeaderDeserialization") ==
        0);
  CHECK(strcmp(st_error_kind_name(23), "") == 0 && strcmp(st_error_kind_name(-1), "") == 0);
}

static void test_write(void) {
  st_tensor t[6];
  size_t n = fixture_tensors(t), file_size = 0, len = 0;
  st_metadata_entry meta = entry("format", "pt");
  void* bytes = NULL;
  unsigned char* on_disk;
  snprintf(fixture, sizeof fixture, "%s", path_in(work, "fixture.safetensors"));
  OK(st_save_file(fixture, t, n, &meta, 1, 0, err));
  OK(st_serialize(t, n, &meta, 1, 0, &bytes, &len, err));
  on_disk = read_file(fixture, &file_size);
  CHECK(on_disk != NULL && file_size == len && memcmp(on_disk, bytes, len) == 0);
  /* The data buffer, 8 + N bytes in, in file order: s, b, e, a, n, f4. */
  if (on_disk != NULL && file_size == len) {
    const unsigned char* data = on_disk + file_size - 40;
    CHECK(memcmp(data, &s_value, 8) == 0 && memcmp(data + 8, b_values, 24) == 0 &&
          memcmp(data + 32, a_values, 4) == 0 && data[36] == 9 && memcmp(data + 37, f4_values, 3) == 0);
  }
  free(on_disk);
  st_bytes_free(bytes);
  st_bytes_free(NULL);
  OK(st_save_file(path_in(work, "nosync.safetensors"), t, n, NULL, 0, ST_SAVE_NO_SYNC, err));
}

static void test_write_errors(void) {
  st_tensor t[2];
  st_metadata_entry meta[2];
  void* bytes = NULL;
  size_t len = 0, before_size = 0, after_size = 0;
  unsigned char *before, *after;
  t[0] = tensor(ST_LITERAL("w"), ST_DTYPE_F32, 2, b_shape, b_values, sizeof b_values);
  t[1] = t[0];
  FAILS(ST_ERR_DUPLICATE_KEY, st_serialize(t, 2, NULL, 0, 0, &bytes, &len, err));
  t[1].name.ptr = "__metadata__";
  t[1].name.len = 12;
  FAILS(ST_ERR_INVALID_TENSOR_NAME, st_serialize(t, 2, NULL, 0, 0, &bytes, &len, err));
  t[1].name.ptr = "\xff";
  t[1].name.len = 1;
  FAILS(ST_ERR_INVALID_TENSOR_NAME, st_serialize(t, 2, NULL, 0, 0, &bytes, &len, err));
  t[1] = tensor(ST_LITERAL("x"), 99, 2, b_shape, b_values, sizeof b_values);
  FAILS(ST_ERR_TYPE_MISMATCH, st_serialize(t, 2, NULL, 0, 0, &bytes, &len, err));
  CHECK(strstr(last_message, "99") != NULL);
  t[1].dtype = -1;
  FAILS(ST_ERR_TYPE_MISMATCH, st_serialize(t, 2, NULL, 0, 0, &bytes, &len, err));
  CHECK(strstr(last_message, "-1") != NULL);
  t[1] = tensor(ST_LITERAL("x"), ST_DTYPE_F32, 2, b_shape, b_values, 20);
  FAILS(ST_ERR_TENSOR_INVALID_INFO, st_serialize(t, 2, NULL, 0, 0, &bytes, &len, err));
  meta[0] = entry("k", "\xfe");
  FAILS(ST_ERR_INVALID_HEADER, st_serialize(t, 1, meta, 1, 0, &bytes, &len, err));
  meta[0] = entry("k", "v");
  meta[1] = entry("k", "w");
  FAILS(ST_ERR_DUPLICATE_KEY, st_serialize(t, 1, meta, 2, 0, &bytes, &len, err));
  FAILS(ST_ERR_INTERNAL, st_serialize(t, 1, NULL, 0, 0x80, &bytes, &len, err));
  FAILS(ST_ERR_INTERNAL, st_serialize(NULL, 1, NULL, 0, 0, &bytes, &len, err));
  FAILS(ST_ERR_IO, st_save_file(work, t, 1, NULL, 0, 0, err));
  /* A write that fails leaves the file there untouched. */
  before = read_file(fixture, &before_size);
  t[1] = tensor(ST_LITERAL("x"), 99, 2, b_shape, b_values, sizeof b_values);
  FAILS(ST_ERR_TYPE_MISMATCH, st_save_file(fixture, t, 2, NULL, 0, 0, err));
  CHECK(strstr(last_message, "fixture.safetensors") != NULL);
  after = read_file(fixture, &after_size);
  CHECK(before != NULL && after != NULL && before_size == after_size &&
        memcmp(before, after, after_size) == 0);
  free(before);
  free(after);
  /* Empty metadata: written as {} only when asked. */
  OK(st_serialize(t, 1, NULL, 0, ST_SAVE_EMPTY_METADATA, &bytes, &len, err));
  CHECK(bytes != NULL && len > 30 && memcmp((char*)bytes + 8, "{\"__metadata__\":{}", 18) == 0);
  st_bytes_free(bytes);
  bytes = NULL;
  OK(st_serialize(t, 1, NULL, 0, 0, &bytes, &len, err));
  CHECK(bytes != NULL && memcmp((char*)bytes + 8, "{\"w\"", 4) == 0);
  st_bytes_free(bytes);
}

static void check_b(const st_file* f, uint32_t backend) {
  st_tensor info;
  float values[6];
  OK(st_file_info(f, ST_LITERAL("b"), &info, err));
  CHECK(str_is(info.name, "b") && info.dtype == ST_DTYPE_F32 && info.rank == 2 && info.shape[0] == 2 &&
        info.shape[1] == 3 && info.byte_size == 24 && info.data_begin == 8 && info.data_end == 32);
  if (backend == ST_BACKEND_MMAP) {
    CHECK(info.data != NULL && memcmp(info.data, b_values, 24) == 0);
  } else {
    CHECK(info.data == NULL);
  }
  memset(values, 0, sizeof values);
  OK(st_file_read(f, ST_LITERAL("b"), values, sizeof values, err));
  CHECK(memcmp(values, b_values, sizeof values) == 0);
  memset(values, 0, sizeof values);
  OK(st_file_read_data(f, 8, values, sizeof values, err));
  CHECK(memcmp(values, b_values, sizeof values) == 0);
}

static void test_file(uint32_t backend) {
  st_file* f = NULL;
  st_file_desc d;
  st_tensor info;
  st_str s, key, value;
  bool found = true;
  size_t i;
  float values[6];
  unsigned char n = 0;
  OK(st_file_open(fixture, backend, &f, err));
  if (f == NULL) return;
  OK(st_file_describe(f, &d, err));
  CHECK(d.tensor_count == 6 && d.backend == backend && !d.in_memory && d.has_metadata &&
        d.metadata_count == 1 && d.data_len == 40 && d.trailing_bytes == 0 && d.header_len % 8 == 0 &&
        str_is(d.path, fixture));
  CHECK(d.bytes_read == 0);
  for (i = 0; i < 6; ++i) {
    OK(st_file_key(f, i, ST_ORDER_SORTED, &s, err));
    CHECK(name_is(s, sorted_names[i]));
    OK(st_file_key(f, i, ST_ORDER_FILE, &s, err));
    CHECK(name_is(s, file_names[i]));
  }
  FAILS(ST_ERR_INTERNAL, st_file_key(f, 6, ST_ORDER_SORTED, &s, err));
  CHECK(strstr(last_message, "out of range") != NULL);
  FAILS(ST_ERR_INTERNAL, st_file_key(f, 0, 7, &s, err));
  check_b(f, backend);
  OK(st_file_info(f, ST_LITERAL("s"), &info, err));
  CHECK(info.rank == 0 && info.shape != NULL && info.byte_size == 8 && info.data_begin == 0);
  OK(st_file_info(f, ST_LITERAL("e"), &info, err));
  CHECK(info.rank == 1 && info.shape[0] == 0 && info.byte_size == 0 && info.data_begin == 32 &&
        info.data_end == 32);
  OK(st_file_read(f, ST_LITERAL("e"), NULL, 0, err));
  OK(st_file_info(f, NUL_NAME, &info, err));
  CHECK(info.byte_size == 1 && info.name.len == 4 && memcmp(info.name.ptr, nul_name, 4) == 0);
  OK(st_file_read(f, NUL_NAME, &n, 1, err));
  CHECK(n == 9);
  OK(st_file_describe(f, &d, err));
  CHECK(backend == ST_BACKEND_MMAP ? d.bytes_read == 0 : d.bytes_read == 24 + 24 + 1);
  /* Metadata. */
  OK(st_file_metadata(f, 0, &key, &value, err));
  CHECK(str_is(key, "format") && str_is(value, "pt"));
  FAILS(ST_ERR_INTERNAL, st_file_metadata(f, 1, &key, &value, err));
  OK(st_file_metadata_get(f, ST_LITERAL("format"), &value, &found, err));
  CHECK(found && str_is(value, "pt"));
  OK(st_file_metadata_get(f, ST_LITERAL("nope"), &value, &found, err));
  CHECK(!found && value.len == 0 && value.ptr != NULL);
  /* Errors name the file and the tensor; a NUL in a name is written \0 in the message. */
  FAILS(ST_ERR_TENSOR_NOT_FOUND, st_file_info(f, ST_LITERAL("zz"), &info, err));
  CHECK(strstr(last_message, "zz") != NULL && strstr(last_message, "fixture.safetensors") != NULL);
  FAILS(ST_ERR_TENSOR_NOT_FOUND, st_file_info(f, "x\0y", 3, &info, err));
  CHECK(strstr(last_message, "x\\0y") != NULL);
  FAILS(ST_ERR_TENSOR_NOT_FOUND, st_file_info(f, "\xff", 1, &info, err));
  FAILS(ST_ERR_INVALID_SLICE, st_file_read(f, ST_LITERAL("b"), values, 20, err));
  FAILS(ST_ERR_INVALID_SLICE, st_file_read_data(f, 30, values, 20, err));
  FAILS(ST_ERR_INTERNAL, st_file_read(f, ST_LITERAL("b"), NULL, 24, err));
  st_file_free(f);
}

/* A mapped file is mapped at its first call that needs its bytes, not at open: one truncated
 * in between is an Io error saying so, never a pointer past the mapping. */
static void test_truncated_before_first_read(void) {
  st_file* f = NULL;
  st_tensor info;
  float values[6];
  size_t size = 0;
  unsigned char* bytes = read_file(fixture, &size);
  char path[4096];
  snprintf(path, sizeof path, "%s", path_in(work, "truncated.safetensors"));
  CHECK(bytes != NULL);
  if (bytes == NULL) return;
  write_file(path, bytes, size);
  free(bytes);
  OK(st_file_open(path, ST_BACKEND_MMAP, &f, err));
  if (f == NULL) return;
  CHECK(truncate(path, 20) == 0);
  FAILS(ST_ERR_IO, st_file_info(f, ST_LITERAL("b"), &info, err));
  CHECK(strstr(last_message, "became shorter") != NULL &&
        strstr(last_message, "truncated.safetensors") != NULL);
  FAILS(ST_ERR_IO, st_file_read(f, ST_LITERAL("b"), values, sizeof values, err));
  FAILS(ST_ERR_IO, st_file_read_data(f, 8, values, sizeof values, err));
  st_file_free(f);
}

static int released = 0;
static void release_counted(void* owner) {
  ++released;
  free(owner);
}

static void test_memory(void) {
  size_t size = 0;
  unsigned char* bytes = read_file(fixture, &size);
  unsigned char *lent, *copy;
  st_file* f = NULL;
  st_slice* slice = NULL;
  st_file_desc d;
  st_tensor info;
  st_index row = st_select(1);
  float values[3];
  if (bytes == NULL) {
    CHECK(bytes != NULL);
    return;
  }
  /* Borrowed, with an owner released once, after the last reader (a slice outlives the file). */
  lent = (unsigned char*)malloc(size);
  memcpy(lent, bytes, size);
  OK(st_file_open_memory(lent, size, "mem.safetensors", 0, release_counted, lent, &f, err));
  OK(st_file_describe(f, &d, err));
  CHECK(d.in_memory && d.backend == ST_BACKEND_MMAP && str_is(d.path, "mem.safetensors") &&
        d.tensor_count == 6);
  OK(st_file_info(f, ST_LITERAL("b"), &info, err));
  CHECK((const unsigned char*)info.data == lent + 8 + d.header_len + 8);
  OK(st_file_slice(f, ST_LITERAL("b"), &row, 1, &slice, err));
  st_file_free(f);
  CHECK(released == 0);
  OK(st_slice_read(slice, values, sizeof values, err));
  CHECK(values[0] == 3 && values[2] == 5);
  st_slice_free(slice);
  CHECK(released == 1);

  /* A buffer that overlaps the file's bytes is refused before anything is written. */
  copy = (unsigned char*)malloc(size);
  memcpy(copy, bytes, size);
  OK(st_file_open_memory(copy, size, NULL, 0, NULL, NULL, &f, err));
  OK(st_file_describe(f, &d, err));
  CHECK(str_is(d.path, "<memory>"));
  FAILS(ST_ERR_INVALID_SLICE, st_file_read(f, ST_LITERAL("b"), copy + size - 24, 24, err));
  CHECK(strstr(last_message, "overlaps") != NULL);
  FAILS(ST_ERR_INVALID_SLICE, st_file_read_data(f, 0, copy, 8, err));
  CHECK(memcmp(copy, bytes, size) == 0);
  st_file_free(f);
  free(copy);

  /* Refused bytes release their owner before the call returns. */
  released = 0;
  lent = (unsigned char*)malloc(size - 1);
  memcpy(lent, bytes, size - 1);
  FAILS(ST_ERR_METADATA_INCOMPLETE_BUFFER,
        st_file_open_memory(lent, size - 1, "mem-bad", 0, release_counted, lent, &f, err));
  CHECK(released == 1 && strstr(last_message, "mem-bad") != NULL);
  lent = (unsigned char*)malloc(1);
  FAILS(ST_ERR_INTERNAL, st_file_open_memory(NULL, size, NULL, 0, release_counted, lent, &f, err));
  CHECK(released == 2);

  /* A copy: the caller's bytes may change at once; the copy is aligned as a mapping is. */
  copy = (unsigned char*)malloc(size + 3);
  memcpy(copy, bytes, size);
  memset(copy + size, 0, 3);
  OK(st_file_open_memory_copy(copy, size, NULL, 0, &f, err));
  memset(copy, 0, size);
  check_b(f, ST_BACKEND_MMAP);
  OK(st_file_describe(f, &d, err));
  OK(st_file_info(f, ST_LITERAL("s"), &info, err));
  CHECK(((uintptr_t)info.data - 8 - d.header_len) % 4096 == 0);
  st_file_free(f);
  /* Trailing bytes: refused unless allowed, then counted. */
  memcpy(copy, bytes, size);
  FAILS(ST_ERR_METADATA_INCOMPLETE_BUFFER, st_file_open_memory_copy(copy, size + 3, NULL, 0, &f, err));
  OK(st_file_open_memory_copy(copy, size + 3, NULL, ST_OPEN_ALLOW_TRAILING_BYTES, &f, err));
  OK(st_file_describe(f, &d, err));
  CHECK(d.trailing_bytes == 3);
  st_file_free(f);
  free(copy);
  free(bytes);
}

static void check_runs(const st_slice* s, const st_byte_run* want, size_t count) {
  st_byte_run runs[8];
  size_t n = 99, i;
  OK(st_slice_runs(s, NULL, 0, &n, err));
  CHECK(n == count);
  OK(st_slice_runs(s, runs, 8, &n, err));
  CHECK(n == count);
  for (i = 0; i < count && i < n; ++i)
    CHECK(runs[i].offset == want[i].offset && runs[i].length == want[i].length);
}

static void test_slices(uint32_t backend) {
  st_file* f = NULL;
  st_slice* s = NULL;
  st_tensor t;
  st_index idx[3];
  float v[4];
  size_t n = 0;
  OK(st_file_open(fixture, backend, &f, err));
  if (f == NULL) return;
  /* b[:, 1:3]: two runs. */
  idx[0] = st_all();
  idx[1] = st_range(1, 3);
  OK(st_file_slice(f, ST_LITERAL("b"), idx, 2, &s, err));
  OK(st_slice_tensor(s, &t, err));
  CHECK(str_is(t.name, "b") && t.dtype == ST_DTYPE_F32 && t.rank == 2 && t.shape[0] == 2 && t.shape[1] == 2 &&
        t.byte_size == 16 && t.data == NULL && t.data_begin == 12 && t.data_end == 32);
  {
    const st_byte_run want[2] = {{12, 8}, {24, 8}};
    check_runs(s, want, 2);
  }
  OK(st_slice_read(s, v, sizeof v, err));
  CHECK(v[0] == 1 && v[1] == 2 && v[2] == 4 && v[3] == 5);
  FAILS(ST_ERR_INVALID_SLICE, st_slice_read(s, v, 12, err));
  FAILS(ST_ERR_INTERNAL, st_slice_runs(s, NULL, 1, &n, err));
  st_slice_free(s);
  /* b[-1]: one run, zero-copy when mapped. */
  idx[0] = st_select(-1);
  OK(st_file_slice(f, ST_LITERAL("b"), idx, 1, &s, err));
  OK(st_slice_tensor(s, &t, err));
  CHECK(t.rank == 1 && t.shape[0] == 3 && t.byte_size == 12);
  CHECK(backend == ST_BACKEND_MMAP ? t.data != NULL && memcmp(t.data, b_values + 3, 12) == 0
                                   : t.data == NULL);
  {
    const st_byte_run want[1] = {{20, 12}};
    check_runs(s, want, 1);
  }
  /* The slice holds its file: it reads after the file is freed. */
  st_file_free(f);
  OK(st_slice_read(s, v, 12, err));
  CHECK(v[0] == 3 && v[1] == 4 && v[2] == 5);
  st_slice_free(s);
  OK(st_file_open(fixture, backend, &f, err));
  /* b[:, ::2]: strided. */
  idx[0] = st_all();
  idx[1] = st_range_step(0, 3, 2);
  OK(st_file_slice(f, ST_LITERAL("b"), idx, 2, &s, err));
  {
    /* Elements 0, 2, 3, 5: the runs of 2 and 3 touch and are merged. */
    const st_byte_run want[3] = {{8, 4}, {16, 8}, {28, 4}};
    check_runs(s, want, 3);
  }
  OK(st_slice_read(s, v, sizeof v, err));
  CHECK(v[0] == 0 && v[1] == 2 && v[2] == 3 && v[3] == 5);
  st_slice_free(s);
  /* What does not fit. */
  idx[0] = st_select(2);
  FAILS(ST_ERR_INVALID_SLICE, st_file_slice(f, ST_LITERAL("b"), idx, 1, &s, err));
  CHECK(strstr(last_message, "b") != NULL);
  idx[0] = st_all();
  idx[1] = st_all();
  idx[2] = st_all();
  FAILS(ST_ERR_INVALID_SLICE, st_file_slice(f, ST_LITERAL("b"), idx, 3, &s, err));
  idx[0] = st_range_step(0, 2, 0);
  FAILS(ST_ERR_INVALID_SLICE, st_file_slice(f, ST_LITERAL("b"), idx, 1, &s, err));
  idx[0].kind = 7;
  FAILS(ST_ERR_INTERNAL, st_file_slice(f, ST_LITERAL("b"), idx, 1, &s, err));
  idx[0] = st_all();
  idx[1] = st_range(0, 1);
  FAILS(ST_ERR_MISALIGNED_SLICE, st_file_slice(f, ST_LITERAL("f4"), idx, 2, &s, err));
  FAILS(ST_ERR_TENSOR_NOT_FOUND, st_file_slice(f, ST_LITERAL("nope"), idx, 1, &s, err));
  FAILS(ST_ERR_INTERNAL, st_file_slice(f, ST_LITERAL("b"), NULL, 1, &s, err));
  /* No indices: the whole tensor. */
  OK(st_file_slice(f, ST_LITERAL("f4"), NULL, 0, &s, err));
  OK(st_slice_tensor(s, &t, err));
  CHECK(t.byte_size == 3 && t.rank == 2);
  st_slice_free(s);
  st_file_free(f);
}

/* A checkpoint of two shards in `dir`, its index listing `extra` (a tensor the shards lack) when
 * not NULL. Returns the index's path. */
static const char* write_checkpoint(const char* dir, const char* extra) {
  static char index[4096];
  static const float x[2] = {1, 2};
  static const unsigned char y[3] = {7, 8, 9};
  static const int32_t z = 42;
  static const size_t x_shape[1] = {2}, y_shape[1] = {3}, z_shape[1] = {1};
  st_tensor t[2];
  char json[1024];
  make_dir(dir);
  t[0] = tensor(ST_LITERAL("x"), ST_DTYPE_F32, 1, x_shape, x, sizeof x);
  t[1] = tensor(ST_LITERAL("y"), ST_DTYPE_U8, 1, y_shape, y, sizeof y);
  OK(st_save_file(path_in(dir, "shard1.safetensors"), t, 2, NULL, 0, ST_SAVE_NO_SYNC, err));
  t[0] = tensor(ST_LITERAL("z"), ST_DTYPE_I32, 1, z_shape, &z, sizeof z);
  OK(st_save_file(path_in(dir, "shard2.safetensors"), t, 1, NULL, 0, ST_SAVE_NO_SYNC, err));
  snprintf(json, sizeof json,
           "{\"metadata\":{\"total_size\":1e3},\"weight_map\":{\"x\":\"shard1.safetensors\","
           "\"y\":\"shard1.safetensors\",\"z\":\"shard2.safetensors\"%s%s%s}}",
           extra ? ",\"" : "", extra ? extra : "", extra ? "\":\"shard2.safetensors\"" : "");
  snprintf(index, sizeof index, "%s", path_in(dir, "model.safetensors.index.json"));
  write_file(index, json, strlen(json));
  return index;
}

static void test_checkpoint(void) {
  char dir[4096], index[4096];
  st_checkpoint* c = NULL;
  st_checkpoint_desc d;
  st_tensor info;
  st_str s, key, value;
  st_slice* slice = NULL;
  st_index range = st_range(1, 3);
  size_t shard = 99, count = 99;
  uint64_t trailing = 99;
  float x[2];
  unsigned char y[2];
  snprintf(dir, sizeof dir, "%s", path_in(work, "ckpt"));
  snprintf(index, sizeof index, "%s", write_checkpoint(dir, NULL));
  OK(st_checkpoint_open(index, ST_BACKEND_MMAP, &c, err));
  if (c == NULL) return;
  OK(st_checkpoint_describe(c, &d, err));
  CHECK(d.tensor_count == 3 && d.shard_count == 2 && d.shards_opened == 0 && !d.lenient && d.has_metadata &&
        d.metadata_count == 1 && str_is(d.path, index));
  OK(st_checkpoint_metadata(c, 0, &key, &value, err));
  CHECK(str_is(key, "total_size") && str_is(value, "1e3"));
  OK(st_checkpoint_key(c, 2, &s, err));
  CHECK(str_is(s, "z"));
  FAILS(ST_ERR_INTERNAL, st_checkpoint_key(c, 3, &s, err));
  OK(st_checkpoint_info(c, ST_LITERAL("z"), &info, err));
  CHECK(info.dtype == ST_DTYPE_I32 && info.data != NULL && *(const int32_t*)info.data == 42);
  OK(st_checkpoint_describe(c, &d, err));
  CHECK(d.shards_opened == 1);
  OK(st_checkpoint_read(c, ST_LITERAL("x"), x, sizeof x, err));
  CHECK(x[0] == 1 && x[1] == 2);
  OK(st_checkpoint_shard_of(c, ST_LITERAL("z"), &shard, err));
  CHECK(shard == 1);
  OK(st_checkpoint_shard(c, 1, &s, &trailing, err));
  CHECK(s.len > 18 && memcmp(s.ptr + s.len - 18, "shard2.safetensors", 18) == 0 && s.ptr[0] == '/' &&
        trailing == 0);
  FAILS(ST_ERR_INTERNAL, st_checkpoint_shard(c, 2, &s, NULL, err));
  OK(st_checkpoint_slice(c, ST_LITERAL("y"), &range, 1, &slice, err));
  st_checkpoint_free(c);
  OK(st_slice_read(slice, y, sizeof y, err));
  CHECK(y[0] == 8 && y[1] == 9);
  st_slice_free(slice);
  OK(st_checkpoint_open(index, ST_BACKEND_READ, &c, err));
  OK(st_checkpoint_missing_count(c, &count, err));
  CHECK(count == 0);
  FAILS(ST_ERR_TENSOR_NOT_FOUND, st_checkpoint_info(c, ST_LITERAL("nope"), &info, err));
  FAILS(ST_ERR_TENSOR_NOT_FOUND, st_checkpoint_shard_of(c, "\xff", 1, &shard, err));
  OK(st_checkpoint_info(c, ST_LITERAL("x"), &info, err));
  CHECK(info.data == NULL);
  st_checkpoint_free(c);

  /* An index listing a tensor its shard lacks: strict refuses the shard, lenient the tensor. */
  snprintf(dir, sizeof dir, "%s", path_in(work, "stale"));
  snprintf(index, sizeof index, "%s", write_checkpoint(dir, "w"));
  OK(st_checkpoint_open(index, 0, &c, err));
  FAILS(ST_ERR_SHARD_MISSING, st_checkpoint_info(c, ST_LITERAL("z"), &info, err));
  st_checkpoint_free(c);
  OK(st_checkpoint_open(index, ST_OPEN_LENIENT, &c, err));
  OK(st_checkpoint_describe(c, &d, err));
  CHECK(d.lenient && d.tensor_count == 4);
  OK(st_checkpoint_info(c, ST_LITERAL("z"), &info, err));
  FAILS(ST_ERR_SHARD_MISSING, st_checkpoint_info(c, ST_LITERAL("w"), &info, err));
  OK(st_checkpoint_missing_count(c, &count, err));
  CHECK(count == 1);
  OK(st_checkpoint_missing_at(c, 0, &s, &shard, err));
  CHECK(str_is(s, "w") && shard == 1);
  FAILS(ST_ERR_INTERNAL, st_checkpoint_missing_at(c, 1, &s, NULL, err));
  st_checkpoint_free(c);
  FAILS(ST_ERR_INTERNAL, st_checkpoint_open(index, ST_OPEN_LENIENT | 0x10000, &c, err));

  /* A shard file that is missing: a broken download, refused at open in both modes. */
  remove(path_in(dir, "shard2.safetensors"));
  FAILS(ST_ERR_SHARD_MISSING, st_checkpoint_open(index, ST_OPEN_LENIENT, &c, err));
  /* A single file is a checkpoint of one shard. */
  OK(st_checkpoint_open(fixture, 0, &c, err));
  OK(st_checkpoint_describe(c, &d, err));
  CHECK(d.tensor_count == 6 && d.shard_count == 1 && d.metadata_count == 1);
  st_checkpoint_free(c);
}

static void test_convert(void) {
  st_file* f = NULL;
  st_tensor src, half, info, w, scale, blocks, scales;
  uint16_t f16[6];
  float back[6], out4[4], out32[32];
  size_t size = 0, i;
  const size_t shape3[1] = {3}, huge[2] = {(size_t)1 << 62, 4}, two[2] = {2, 2}, one[2] = {1, 1};
  const size_t blocks_shape[2] = {1, 16}, scales_shape[1] = {1};
  const unsigned char fp8[4] = {0x38, 0x38, 0x38, 0x38};
  const float two_f = 2.0f;
  unsigned char packed[16], exponent = 128;
  float in_place[6];
  OK(st_tensor_byte_size(ST_DTYPE_F16, b_shape, 2, &size, err));
  CHECK(size == 12);
  FAILS(ST_ERR_MISALIGNED_SLICE, st_tensor_byte_size(ST_DTYPE_F4, shape3, 1, &size, err));
  FAILS(ST_ERR_VALIDATION_OVERFLOW, st_tensor_byte_size(ST_DTYPE_F32, huge, 2, &size, err));
  FAILS(ST_ERR_TYPE_MISMATCH, st_tensor_byte_size(99, b_shape, 2, &size, err));
  /* F32 -> F16 -> F32, exact for these small integers. */
  src = tensor(ST_LITERAL("b"), ST_DTYPE_F32, 2, b_shape, b_values, sizeof b_values);
  OK(st_convert(&src, ST_DTYPE_F16, f16, sizeof f16, err));
  CHECK(f16[1] == 0x3C00 && f16[2] == 0x4000);
  half = tensor(ST_LITERAL("h"), ST_DTYPE_F16, 2, b_shape, f16, sizeof f16);
  OK(st_convert(&half, ST_DTYPE_F32, back, sizeof back, err));
  CHECK(memcmp(back, b_values, sizeof back) == 0);
  /* A file's info is a tensor as conversions take it (zero-copy, mapped). */
  OK(st_file_open(fixture, ST_BACKEND_MMAP, &f, err));
  OK(st_file_info(f, ST_LITERAL("b"), &info, err));
  memset(f16, 0, sizeof f16);
  OK(st_convert(&info, ST_DTYPE_F16, f16, sizeof f16, err));
  CHECK(f16[1] == 0x3C00);
  st_file_free(f);
  FAILS(ST_ERR_TYPE_MISMATCH, st_convert(&src, ST_DTYPE_I32, back, sizeof back, err));
  FAILS(ST_ERR_TYPE_MISMATCH, st_convert(&src, 40, back, sizeof back, err));
  FAILS(ST_ERR_TENSOR_INVALID_INFO, st_convert(&src, ST_DTYPE_F16, f16, 10, err));
  src.byte_size = 20;
  FAILS(ST_ERR_TENSOR_INVALID_INFO, st_convert(&src, ST_DTYPE_F16, f16, sizeof f16, err));
  memcpy(in_place, b_values, sizeof in_place);
  src = tensor(ST_LITERAL("b"), ST_DTYPE_F32, 2, b_shape, in_place, sizeof in_place);
  FAILS(ST_ERR_INVALID_SLICE, st_convert(&src, ST_DTYPE_F32, in_place, sizeof in_place, err));
  CHECK(memcmp(in_place, b_values, sizeof in_place) == 0);
  src.dtype = ST_DTYPE_C64;
  src.rank = 1;
  src.shape = shape3;
  src.byte_size = 24;
  FAILS(ST_ERR_TYPE_MISMATCH, st_convert(&src, ST_DTYPE_F32, back, 12, err));
  /* DeepSeek-style fp8 blocks: 1.0 everywhere, one block scaled by 2. */
  w = tensor(ST_LITERAL("w"), ST_DTYPE_F8_E4M3, 2, two, fp8, sizeof fp8);
  scale = tensor(ST_LITERAL("s"), ST_DTYPE_F32, 2, one, &two_f, sizeof two_f);
  OK(st_dequantize_fp8_blocks(&w, &scale, 128, 128, ST_DTYPE_F32, out4, sizeof out4, err));
  CHECK(out4[0] == 2 && out4[3] == 2);
  FAILS(ST_ERR_TENSOR_INVALID_INFO,
        st_dequantize_fp8_blocks(&w, &scale, 128, 128, ST_DTYPE_F32, out4, 8, err));
  /* MXFP4: byte 0 holds 0.5 (low nibble) and 1.0; the scale 2^(128-127) doubles them. */
  memset(packed, 0, sizeof packed);
  packed[0] = 0x21;
  blocks = tensor(ST_LITERAL("blocks"), ST_DTYPE_U8, 2, blocks_shape, packed, sizeof packed);
  scales = tensor(ST_LITERAL("scales"), ST_DTYPE_U8, 1, scales_shape, &exponent, 1);
  OK(st_dequantize_mxfp4(&blocks, &scales, ST_DTYPE_F32, out32, sizeof out32, err));
  CHECK(out32[0] == 1.0f && out32[1] == 2.0f);
  for (i = 2; i < 32; ++i) CHECK(out32[i] == 0);
  FAILS(ST_ERR_INVALID_SLICE, st_dequantize_mxfp4(&blocks, &scales, ST_DTYPE_F32, packed, 16, err));
  scales.dtype = ST_DTYPE_F32;
  FAILS(ST_ERR_TYPE_MISMATCH, st_dequantize_mxfp4(&blocks, &scales, ST_DTYPE_F32, out32, sizeof out32, err));
}

/* Streams every tensor of `f` (file order) and checks each against st_file_read. */
static void test_streams(uint32_t backend) {
  st_file* f = NULL;
  st_stream* s = NULL;
  st_stream_tensor *t = NULL, *held = NULL;
  st_stream_desc d;
  st_tensor v;
  st_request r[2];
  st_index cols[2];
  size_t i = 0, request = 99, file = 99;
  unsigned char buf[64];
  OK(st_file_open(fixture, backend, &f, err));
  if (f == NULL) return;
  OK(st_stream_file(f, NULL, 0, 0, 0, &s, err));
  OK(st_stream_describe(s, &d, err));
  CHECK(d.tensor_count == 6 && d.total_bytes == 40);
  for (;;) {
    OK(st_stream_next(s, &t, err));
    if (t == NULL) break;
    OK(st_stream_tensor_get(t, &v, &request, &file, err));
    CHECK(i < 6 && name_is(v.name, file_names[i]) && request == i && file == 0 && v.data != NULL);
    OK(st_file_read(f, v.name.ptr, v.name.len, buf, v.byte_size, err));
    CHECK(memcmp(buf, v.data, v.byte_size) == 0);
    st_stream_tensor_free(t);
    ++i;
  }
  CHECK(i == 6);
  OK(st_stream_next(s, &t, err));
  CHECK(t == NULL);
  st_stream_free(s);

  /* Requests, delivered in file order: a selection of b (request 1) before a (request 0). */
  memset(r, 0, sizeof r);
  cols[0] = st_all();
  cols[1] = st_range(1, 3);
  r[0].name.ptr = "a";
  r[0].name.len = 1;
  r[1].name.ptr = "b";
  r[1].name.len = 1;
  r[1].indices = cols;
  r[1].index_count = 2;
  OK(st_stream_file(f, r, 2, 0, ST_STREAM_WAIT_FOR_RELEASE, &s, err));
  OK(st_stream_next(s, &t, err));
  OK(st_stream_tensor_get(t, &v, &request, NULL, err));
  CHECK(str_is(v.name, "b") && request == 1 && v.rank == 2 && v.shape[1] == 2 && v.byte_size == 16 &&
        ((const float*)v.data)[2] == 4);
  /* A delivered tensor outlives its stream. */
  st_stream_free(s);
  CHECK(((const float*)v.data)[3] == 5);
  st_stream_tensor_free(t);
  /* An empty list streams nothing; a missing tensor is refused before anything is read. */
  OK(st_stream_file(f, r, 0, 0, 0, &s, err));
  OK(st_stream_next(s, &t, err));
  CHECK(t == NULL);
  st_stream_free(s);
  r[0].name.ptr = "nope";
  r[0].name.len = 4;
  FAILS(ST_ERR_TENSOR_NOT_FOUND, st_stream_file(f, r, 1, 0, 0, &s, err));
  FAILS(ST_ERR_INTERNAL, st_stream_file(f, NULL, 1, 0, 0, &s, err));
  FAILS(ST_ERR_INTERNAL, st_stream_file(f, NULL, 0, 0, 0x40, &s, err));

  /* A budget of one byte: holding s, the next tensor waits for the caller, who is told so;
   * after freeing it the stream goes on where it was. */
  OK(st_stream_file(f, NULL, 0, 1, 0, &s, err));
  OK(st_stream_next(s, &held, err));
  OK(st_stream_tensor_get(held, &v, NULL, NULL, err));
  CHECK(str_is(v.name, "s"));
  FAILS(ST_ERR_BUDGET_EXCEEDED, st_stream_next(s, &t, err));
  CHECK(t == NULL && strstr(last_message, "b") != NULL);
  st_stream_tensor_free(held);
  OK(st_stream_next(s, &t, err));
  OK(st_stream_tensor_get(t, &v, NULL, NULL, err));
  CHECK(str_is(v.name, "b"));
  st_stream_tensor_free(t);
  OK(st_stream_describe(s, &d, err));
  CHECK(d.peak_inflight_bytes == 24);
  st_stream_free(s);
  st_file_free(f);
}

static void test_checkpoint_streams_and_prefetch(void) {
  char dir[4096];
  st_checkpoint* c = NULL;
  st_stream* s = NULL;
  st_stream_tensor* t = NULL;
  st_prefetch* p = NULL;
  st_tensor v;
  st_request r;
  size_t n = 0, file = 99;
  uint64_t done = 1, total = 1;
  snprintf(dir, sizeof dir, "%s", path_in(work, "ckpt-stream"));
  OK(st_checkpoint_open(write_checkpoint(dir, NULL), ST_BACKEND_DIRECT, &c, err));
  if (c == NULL) return;
  OK(st_stream_checkpoint(c, NULL, 0, 0, 0, &s, err));
  for (;;) {
    OK(st_stream_next(s, &t, err));
    if (t == NULL) break;
    OK(st_stream_tensor_get(t, &v, NULL, &file, err));
    CHECK(str_is(v.name, n < 2 ? (n == 0 ? "x" : "y") : "z") && file == (n < 2 ? 0u : 1u));
    st_stream_tensor_free(t);
    ++n;
  }
  CHECK(n == 3);
  st_stream_free(s);
  OK(st_prefetch_checkpoint(c, NULL, 0, 0, 0, &p, err));
  OK(st_prefetch_wait(p, err));
  OK(st_prefetch_progress(p, &done, &total, err));
  CHECK(total == 8 + 3 + 4 && done == total);
  st_prefetch_free(p);
  memset(&r, 0, sizeof r);
  r.name.ptr = "z";
  r.name.len = 1;
  r.has_file = 1;
  r.file = 0;
  FAILS(ST_ERR_TENSOR_NOT_FOUND, st_prefetch_checkpoint(c, &r, 1, 0, 0, &p, err));
  r.file = 1;
  OK(st_prefetch_checkpoint(c, &r, 1, 1, 4096, &p, err));
  OK(st_prefetch_wait(p, err));
  OK(st_prefetch_progress(p, NULL, &total, err));
  CHECK(total == 4);
  st_prefetch_free(p);
  st_checkpoint_free(c);
}

static void test_prefetch_and_advice(void) {
  st_file* f = NULL;
  st_prefetch* p = NULL;
  st_request r;
  uint64_t done = 1, total = 1;
  size_t size = 0;
  unsigned char* bytes;
  OK(st_file_open(fixture, ST_BACKEND_MMAP, &f, err));
  if (f == NULL) return;
  OK(st_prefetch_file(f, NULL, 0, 2, 0, &p, err));
  OK(st_prefetch_wait(p, err));
  OK(st_prefetch_wait(p, err));
  OK(st_prefetch_progress(p, &done, &total, err));
  CHECK(total == 40 && done == 40);
  st_prefetch_free(p);
  memset(&r, 0, sizeof r);
  r.name.ptr = "b";
  r.name.len = 1;
  OK(st_prefetch_file(f, &r, 1, 0, 0, &p, err));
  OK(st_prefetch_progress(p, NULL, &total, err));
  CHECK(total == 24);
  st_prefetch_free(p);
  OK(st_advise_file(f, NULL, 0, ST_ADVICE_WILL_NEED, err));
  OK(st_advise_file(f, &r, 1, ST_ADVICE_SEQUENTIAL, err));
  OK(st_advise_file(f, NULL, 0, ST_ADVICE_RANDOM, err));
  FAILS(ST_ERR_INTERNAL, st_advise_file(f, NULL, 0, 9, err));
  st_file_free(f);
  /* A file in memory has nothing to warm. */
  bytes = read_file(fixture, &size);
  OK(st_file_open_memory(bytes, size, NULL, 0, NULL, NULL, &f, err));
  OK(st_prefetch_file(f, NULL, 0, 0, 0, &p, err));
  OK(st_prefetch_wait(p, err));
  OK(st_prefetch_progress(p, NULL, &total, err));
  CHECK(total == 0);
  st_prefetch_free(p);
  st_file_free(f);
  free(bytes);
}

static void test_upload_plan(void) {
  st_file* f = NULL;
  st_upload_plan* plan = NULL;
  st_placement pl;
  st_request r;
  st_index row = st_select(1);
  size_t count = 0, i;
  uint64_t total = 0, end = 0;
  OK(st_file_open(fixture, ST_BACKEND_READ, &f, err));
  if (f == NULL) return;
  OK(st_upload_plan_file(f, NULL, 0, 0, &plan, err));
  OK(st_upload_plan_describe(plan, &count, &total, err));
  CHECK(count == 6);
  for (i = 0; i < count; ++i) {
    OK(st_upload_plan_placement(plan, i, &pl, err));
    CHECK(name_is(pl.name, sorted_names[i]) && pl.offset % 256 == 0 && pl.offset >= end);
    end = pl.offset + pl.byte_size;
  }
  CHECK(total >= end);
  FAILS(ST_ERR_INTERNAL, st_upload_plan_placement(plan, 6, &pl, err));
  st_upload_plan_free(plan);
  memset(&r, 0, sizeof r);
  r.name.ptr = "b";
  r.name.len = 1;
  r.indices = &row;
  r.index_count = 1;
  OK(st_upload_plan_file(f, &r, 1, 64, &plan, err));
  st_file_free(f);
  OK(st_upload_plan_describe(plan, &count, &total, err));
  OK(st_upload_plan_placement(plan, 0, &pl, err));
  CHECK(count == 1 && total == 12 && pl.dtype == ST_DTYPE_F32 && pl.rank == 1 && pl.shape[0] == 3 &&
        pl.byte_size == 12 && pl.offset == 0);
  st_upload_plan_free(plan);
  OK(st_file_open(fixture, 0, &f, err));
  /* A pin past a file's one file finds nothing there (the core's rule, as in C++). */
  r.has_file = 1;
  r.file = 1;
  FAILS(ST_ERR_TENSOR_NOT_FOUND, st_upload_plan_file(f, &r, 1, 0, &plan, err));
  /* An alignment that is not a power of two is refused (0 is the default, 256). */
  r.has_file = 0;
  FAILS(ST_ERR_INVALID_SLICE, st_upload_plan_file(f, &r, 1, 3, &plan, err));
  CHECK(strstr(last_message, "power of two") != NULL);
  r.has_file = 0;
  r.name.ptr = "nope";
  r.name.len = 4;
  FAILS(ST_ERR_TENSOR_NOT_FOUND, st_upload_plan_file(f, &r, 1, 0, &plan, err));
  st_file_free(f);
}

static void test_careless(void) {
  st_file* f = NULL;
  st_error reused = ST_ERROR_INIT;
  st_file_desc d;
  char* first;
  FAILS(ST_ERR_INTERNAL, st_file_open(NULL, 0, &f, err));
  CHECK(strstr(last_message, "st_file_open") != NULL && strstr(last_message, "`path`") != NULL);
  FAILS(ST_ERR_INTERNAL, st_file_open(fixture, 0, NULL, err));
  FAILS(ST_ERR_INTERNAL, st_file_open(fixture, 3, &f, err));
  FAILS(ST_ERR_INTERNAL, st_file_open(fixture, 0x10000, &f, err));
  FAILS(ST_ERR_INTERNAL, st_file_open(fixture, ST_OPEN_LENIENT, &f, err));
  FAILS(ST_ERR_INTERNAL, st_file_describe(NULL, &d, err));
  CHECK(strstr(last_message, "st_file_describe: `file` is NULL") != NULL);
  FAILS(ST_ERR_IO, st_file_open(path_in(work, "missing.safetensors"), 0, &f, err));
  FAILS(ST_ERR_IO, st_file_open(work, 0, &f, err));
  CHECK(strstr(last_message, "directory") != NULL);
  CHECK(f == NULL);
  /* Without an st_error, the status alone says it. */
  CHECK(st_file_open(NULL, 0, &f, NULL) == ST_FAILED);
  /* One st_error for several calls: each failure replaces the message, success keeps it. */
  CHECK(st_file_open(NULL, 0, &f, &reused) == ST_FAILED);
  first = reused.message;
  CHECK(first != NULL && reused.kind == ST_ERR_INTERNAL);
  CHECK(st_file_open(path_in(work, "missing.safetensors"), 0, &f, &reused) == ST_FAILED);
  CHECK(reused.kind == ST_ERR_IO && strstr(reused.message, "missing.safetensors") != NULL);
  CHECK(st_file_open(fixture, 0, &f, &reused) == ST_OK && reused.kind == ST_ERR_IO);
  st_file_free(f);
  st_error_clear(&reused);
  CHECK(reused.message == NULL && reused.message_len == 0);
  st_error_clear(NULL);
  /* Every free accepts NULL. */
  st_file_free(NULL);
  st_checkpoint_free(NULL);
  st_slice_free(NULL);
  st_stream_free(NULL);
  st_stream_tensor_free(NULL);
  st_prefetch_free(NULL);
  st_upload_plan_free(NULL);
  st_uploader_free(NULL);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s WORK_DIR\n", argv[0]);
    return 2;
  }
  work = argv[1];
  make_dir(work);
  test_names_and_version();
  test_write();
  test_write_errors();
  test_file(ST_BACKEND_MMAP);
  test_file(ST_BACKEND_READ);
  test_file(ST_BACKEND_DIRECT);
  test_truncated_before_first_read();
  test_memory();
  test_slices(ST_BACKEND_MMAP);
  test_slices(ST_BACKEND_READ);
  test_checkpoint();
  test_convert();
  test_streams(ST_BACKEND_MMAP);
  test_streams(ST_BACKEND_DIRECT);
  test_checkpoint_streams_and_prefetch();
  test_prefetch_and_advice();
  test_upload_plan();
  test_careless();
  if (test_failures > 0) {
    fprintf(stderr, "%d checks failed\n", test_failures);
    return 1;
  }
  printf("all C API checks passed\n");
  return 0;
}
