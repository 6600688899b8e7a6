/* The C streaming writer (st_writer): a file written in pieces in any order is byte-identical
 * to st_save_file of the same tensors; a sharded checkpoint has the shards and index its file
 * names say and reads back through st_checkpoint_open; every piece error has its kind; nothing
 * appears under the target's name before st_writer_finish, a freed writer leaves nothing behind,
 * and a failed finish keeps the writer, which finishes once the cause is fixed.
 *
 *   c_writer_test WORK_DIR */
#include "support.h"

#include <dirent.h>
#include <stdint.h>
#include <unistd.h>

static const char* work;

static const size_t w_shape[2] = {4, 8}; /* 32 floats, 128 bytes */
static const size_t b_shape[1] = {3};    /* 3 u8 */
static float w_values[32];
static const unsigned char b_values[3] = {7, 8, 9};

static st_tensor declare(const char* name, int32_t dtype, size_t rank, const size_t* shape, const void* data,
                         size_t size) {
  st_tensor t;
  memset(&t, 0, sizeof t);
  t.name.ptr = name;
  t.name.len = strlen(name);
  t.dtype = dtype;
  t.rank = rank;
  t.shape = shape;
  t.data = data; /* ignored by st_writer_create; used by st_save_file */
  t.byte_size = size;
  return t;
}

static size_t tensors(st_tensor* t) {
  t[0] = declare("w", ST_DTYPE_F32, 2, w_shape, w_values, sizeof w_values);
  t[1] = declare("b", ST_DTYPE_U8, 1, b_shape, b_values, sizeof b_values);
  return 2;
}

/* Number of entries in `dir` other than . and .. */
static int entries(const char* dir) {
  int n = 0;
  struct dirent* e;
  DIR* d = opendir(dir);
  if (d == NULL) return -1;
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) ++n;
  closedir(d);
  return n;
}

static int same_files(const char* a, const char* b) {
  size_t na = 0, nb = 0;
  unsigned char* x = read_file(a, &na);
  unsigned char* y = read_file(b, &nb);
  int same = x != NULL && y != NULL && na == nb && memcmp(x, y, na) == 0;
  free(x);
  free(y);
  return same;
}

static void test_one_file(void) {
  st_tensor t[2];
  size_t n = tensors(t);
  st_metadata_entry meta;
  st_writer* w = NULL;
  st_str name;
  char expected[4096], dir[4096];
  meta.key.ptr = "format";
  meta.key.len = 6;
  meta.value.ptr = "pt";
  meta.value.len = 2;
  snprintf(dir, sizeof dir, "%s", path_in(work, "one"));
  make_dir(dir);
  snprintf(expected, sizeof expected, "%s", path_in(work, "expected.safetensors"));
  OK(st_save_file(expected, t, n, &meta, 1, 0, err));

  OK(st_writer_create(path_in(dir, "out.safetensors"), t, n, &meta, 1, NULL, &w, err));
  CHECK(st_writer_file_count(w) == 1);
  OK(st_writer_file_name(w, 0, &name, err));
  CHECK(str_is(name, "out.safetensors"));
  FAILS(ST_ERR_INTERNAL, st_writer_file_name(w, 1, &name, err));
  /* Pieces out of order, the float tensor in three chunks. */
  OK(st_writer_write(w, ST_LITERAL("w"), 64, (const unsigned char*)w_values + 64, 64, err));
  OK(st_writer_write(w, ST_LITERAL("b"), 0, b_values, 3, err));
  /* Nothing under the target's name yet: only the temporary file (or none, with O_TMPFILE). */
  CHECK(!is_regular(path_in(dir, "out.safetensors")));
  OK(st_writer_write(w, ST_LITERAL("w"), 0, w_values, 32, err));
  OK(st_writer_write(w, ST_LITERAL("w"), 32, (const unsigned char*)w_values + 32, 32, err));
  OK(st_writer_finish(w, err));
  CHECK(same_files(expected, path_in(dir, "out.safetensors")));
  CHECK(entries(dir) == 1);
}

static void test_piece_errors(void) {
  st_tensor t[2];
  size_t n = tensors(t);
  st_writer* w = NULL;
  st_write_options options;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path_in(work, "errors"));
  make_dir(dir);
  OK(st_writer_create(path_in(dir, "e.safetensors"), t, n, NULL, 0, NULL, &w, err));
  FAILS(ST_ERR_TENSOR_NOT_FOUND, st_writer_write(w, ST_LITERAL("nope"), 0, b_values, 1, err));
  /* A name that is not UTF-8 was never declared, as the C++ writer says. */
  FAILS(ST_ERR_TENSOR_NOT_FOUND, st_writer_write(w, "\xff", 1, 0, b_values, 1, err));
  CHECK(strstr(last_message, "e.safetensors") != NULL);
  FAILS(ST_ERR_TENSOR_INVALID_INFO, st_writer_write(w, ST_LITERAL("b"), 2, b_values, 2, err));
  OK(st_writer_write(w, ST_LITERAL("b"), 0, b_values, 2, err));
  FAILS(ST_ERR_INVALID_OFFSET, st_writer_write(w, ST_LITERAL("b"), 1, b_values, 2, err));
  FAILS(ST_ERR_INTERNAL, st_writer_write(w, ST_LITERAL("b"), 2, NULL, 1, err));
  FAILS(ST_ERR_INTERNAL, st_writer_write(NULL, ST_LITERAL("b"), 2, b_values, 1, err));
  /* Bytes missing: finish fails, publishes nothing and keeps the writer, which finishes once
   * they are written. */
  FAILS(ST_ERR_METADATA_INCOMPLETE_BUFFER, st_writer_finish(w, err));
  CHECK(strstr(last_message, "`w`") != NULL);
  CHECK(entries(dir) == 0);
  FAILS(ST_ERR_METADATA_INCOMPLETE_BUFFER, st_writer_finish(w, err));
  OK(st_writer_write(w, ST_LITERAL("b"), 2, b_values + 2, 1, err));
  OK(st_writer_write(w, ST_LITERAL("w"), 0, w_values, sizeof w_values, err));
  OK(st_writer_finish(w, err)); /* and frees it */
  CHECK(entries(dir) == 1);
  CHECK(is_regular(path_in(dir, "e.safetensors")));
  FAILS(ST_ERR_INTERNAL, st_writer_finish(NULL, err));

  /* A writer freed before finishing leaves nothing, and an existing target untouched. */
  write_file(path_in(dir, "keep.safetensors"), "old", 3);
  OK(st_writer_create(path_in(dir, "keep.safetensors"), t, n, NULL, 0, NULL, &w, err));
  OK(st_writer_write(w, ST_LITERAL("b"), 0, b_values, 3, err));
  st_writer_free(w);
  st_writer_free(NULL);
  CHECK(entries(dir) == 2);
  {
    size_t size = 0;
    unsigned char* kept = read_file(path_in(dir, "keep.safetensors"), &size);
    CHECK(kept != NULL && size == 3 && memcmp(kept, "old", 3) == 0);
    free(kept);
  }

  /* Declarations and options are checked before anything is created. */
  memset(&options, 0, sizeof options);
  options.alignment = 3;
  FAILS(ST_ERR_INVALID_SLICE,
        st_writer_create(path_in(dir, "a.safetensors"), t, n, NULL, 0, &options, &w, err));
  options.alignment = 0;
  options.flags = 0x80;
  FAILS(ST_ERR_INTERNAL, st_writer_create(path_in(dir, "a.safetensors"), t, n, NULL, 0, &options, &w, err));
  t[1] = t[0];
  FAILS(ST_ERR_DUPLICATE_KEY, st_writer_create(path_in(dir, "a.safetensors"), t, n, NULL, 0, NULL, &w, err));
  t[1].dtype = 99;
  t[1].name.ptr = "x";
  FAILS(ST_ERR_TYPE_MISMATCH, st_writer_create(path_in(dir, "a.safetensors"), t, n, NULL, 0, NULL, &w, err));
  {
    char missing[4200];
    snprintf(missing, sizeof missing, "%s/missing/a.safetensors", dir);
    FAILS(ST_ERR_IO, st_writer_create(missing, t, 1, NULL, 0, NULL, &w, err));
  }
  CHECK(entries(dir) == 2);
}

/* A finish whose rename fails (a directory where the file goes) publishes nothing, keeps the
 * writer with the same error kind as the C++ face, and finishes once the way is clear. */
static void test_failed_rename(void) {
  st_tensor t[2];
  size_t n = tensors(t);
  st_writer* w = NULL;
  char dir[4096], target[4096], expected[4096];
  snprintf(dir, sizeof dir, "%s", path_in(work, "rename"));
  make_dir(dir);
  snprintf(target, sizeof target, "%s", path_in(dir, "out.safetensors"));
  snprintf(expected, sizeof expected, "%s", path_in(work, "rename-expected.safetensors"));
  OK(st_save_file(expected, t, n, NULL, 0, 0, err));
  OK(st_writer_create(target, t, n, NULL, 0, NULL, &w, err));
  OK(st_writer_write(w, ST_LITERAL("w"), 0, w_values, sizeof w_values, err));
  OK(st_writer_write(w, ST_LITERAL("b"), 0, b_values, 3, err));
  make_dir(target);
  FAILS(ST_ERR_IO, st_writer_finish(w, err));
  CHECK(strstr(last_message, "finish") != NULL); /* says it may be finished again */
  CHECK(rmdir(target) == 0);
  OK(st_writer_finish(w, err));
  CHECK(same_files(expected, target));
  CHECK(entries(dir) == 1); /* nothing left beside it */
}

static void test_aligned(void) {
  st_tensor t[2];
  size_t n = tensors(t), size = 0;
  st_writer* w = NULL;
  st_write_options options;
  st_file* f = NULL;
  st_tensor info;
  unsigned char* bytes;
  uint64_t header_len = 0;
  memset(&options, 0, sizeof options);
  options.alignment = 4096;
  OK(st_writer_create(path_in(work, "aligned.safetensors"), t, n, NULL, 0, &options, &w, err));
  OK(st_writer_write(w, ST_LITERAL("w"), 0, w_values, sizeof w_values, err));
  OK(st_writer_write(w, ST_LITERAL("b"), 0, b_values, 3, err));
  OK(st_writer_finish(w, err));
  bytes = read_file(path_in(work, "aligned.safetensors"), &size);
  CHECK(bytes != NULL && size >= 8);
  if (bytes != NULL && size >= 8) {
    int i;
    for (i = 7; i >= 0; --i) header_len = header_len << 8 | bytes[i];
    CHECK((8 + header_len) % 4096 == 0);
  }
  free(bytes);
  OK(st_file_open(path_in(work, "aligned.safetensors"), ST_BACKEND_MMAP, &f, err));
  OK(st_file_info(f, ST_LITERAL("w"), &info, err));
  CHECK(info.byte_size == sizeof w_values && info.data != NULL &&
        memcmp(info.data, w_values, sizeof w_values) == 0);
  st_file_free(f);
}

static void test_sharded(void) {
  st_tensor t[2];
  size_t n = tensors(t);
  st_writer* w = NULL;
  st_write_options options;
  st_checkpoint* ck = NULL;
  st_tensor info;
  st_str name;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path_in(work, "sharded"));
  make_dir(dir);
  memset(&options, 0, sizeof options);
  options.max_shard_size = 100; /* w (128 bytes) and b in shards of their own */
  options.prefix.ptr = "m";
  options.prefix.len = 1;
  OK(st_writer_create_sharded(dir, t, n, NULL, 0, &options, &w, err));
  CHECK(st_writer_file_count(w) == 3);
  OK(st_writer_file_name(w, 0, &name, err));
  CHECK(str_is(name, "m-00001-of-00002.safetensors"));
  OK(st_writer_file_name(w, 2, &name, err));
  CHECK(str_is(name, "m.safetensors.index.json"));
  OK(st_writer_write(w, ST_LITERAL("b"), 0, b_values, 3, err));
  OK(st_writer_write(w, ST_LITERAL("w"), 0, w_values, sizeof w_values, err));
  CHECK(entries(dir) == 0); /* published only by finish */
  OK(st_writer_finish(w, err));
  CHECK(entries(dir) == 3);
  OK(st_checkpoint_open(path_in(dir, "m.safetensors.index.json"), ST_BACKEND_MMAP, &ck, err));
  OK(st_checkpoint_info(ck, ST_LITERAL("w"), &info, err));
  CHECK(info.data != NULL && memcmp(info.data, w_values, sizeof w_values) == 0);
  OK(st_checkpoint_info(ck, ST_LITERAL("b"), &info, err));
  CHECK(info.data != NULL && memcmp(info.data, b_values, 3) == 0);
  st_checkpoint_free(ck);

  options.prefix.ptr = "a/b";
  options.prefix.len = 3;
  FAILS(ST_ERR_INVALID_SHARD_PATH, st_writer_create_sharded(dir, t, n, NULL, 0, &options, &w, err));
  options.prefix.ptr = "\xff";
  options.prefix.len = 1;
  FAILS(ST_ERR_INVALID_SHARD_PATH, st_writer_create_sharded(dir, t, n, NULL, 0, &options, &w, err));
}

int main(int argc, char** argv) {
  int i;
  if (argc != 2) {
    fprintf(stderr, "usage: %s WORK_DIR\n", argv[0]);
    return 2;
  }
  work = argv[1];
  make_dir(work);
  for (i = 0; i < 32; ++i) w_values[i] = (float)i * 0.5f;
  test_one_file();
  test_piece_errors();
  test_failed_rename();
  test_aligned();
  test_sharded();
  if (test_failures > 0) {
    fprintf(stderr, "%d checks failed\n", test_failures);
    return 1;
  }
  printf("all C writer checks passed\n");
  return 0;
}
