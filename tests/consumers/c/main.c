/* A C program on the installed library: `#include <safetensors.h>` and the library are all it
 * needs. Writes a file, reads it back zero-copy, and checks an error's kind.
 *
 *   consumer_c WORK_DIR */
#include <safetensors.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  static const float values[4] = {1, 2, 3, 4};
  static const size_t shape[2] = {2, 2};
  char path[4096];
  st_error err = ST_ERROR_INIT;
  st_file* f = NULL;
  st_tensor t, info;
  int ok;
  if (argc != 2) return 2;
  if (st_version() != ST_VERSION) {
    fprintf(stderr, "library %s, header %d.%d.%d\n", st_version_string(), ST_VERSION_MAJOR, ST_VERSION_MINOR,
            ST_VERSION_PATCH);
    return 1;
  }
  snprintf(path, sizeof path, "%s/consumer.safetensors", argv[1]);
  memset(&t, 0, sizeof t);
  t.name.ptr = "w";
  t.name.len = 1;
  t.dtype = ST_DTYPE_F32;
  t.rank = 2;
  t.shape = shape;
  t.data = values;
  t.byte_size = sizeof values;
  if (st_save_file(path, &t, 1, NULL, 0, 0, &err) != ST_OK ||
      st_file_open(path, ST_BACKEND_MMAP, &f, &err) != ST_OK ||
      st_file_info(f, ST_LITERAL("w"), &info, &err) != ST_OK) {
    fprintf(stderr, "%s: %s\n", st_error_kind_name(err.kind), err.message);
    st_error_clear(&err);
    st_file_free(f);
    return 1;
  }
  ok = info.dtype == ST_DTYPE_F32 && info.rank == 2 && memcmp(info.data, values, sizeof values) == 0;
  ok = ok && st_file_info(f, ST_LITERAL("nope"), &info, &err) == ST_FAILED &&
       err.kind == ST_ERR_TENSOR_NOT_FOUND;
  st_error_clear(&err);
  st_file_free(f);
  printf("%s: safetensors %s from C\n", ok ? "ok" : "FAILED", st_version_string());
  return ok ? 0 : 1;
}
