/* The hostile-file corpus (tests/hostile/make_corpus.py) through the C API: every file opened
 * with each backend, from memory (borrowed, its owner released exactly once), as a checkpoint,
 * and streamed with each backend; every tensor of a file that opens read whole, zero-copy and as
 * a selection, the three agreeing. Prints one line per file and way, `FILE\tWAY\tOUTCOME` (`OK`
 * or the error kind), in the format of the C++ API's program (hostile_kinds.cpp), which
 * compare_hostile.cmake checks line for line; and fails when a file's outcome is not the
 * manifest's kind, or an error's message does not name the file. The asan preset runs it under
 * AddressSanitizer + UndefinedBehaviorSanitizer.
 *
 *   c_hostile_test CORPUS_DIR */
#include "support.h"

static int mismatches = 0;

/* Whether the error names the file (its name without ".safetensors", as the C++ test checks). */
static void check_named(const st_error* err, const char* file) {
  size_t stem = strlen(file) > 12 ? strlen(file) - 12 : strlen(file);
  char want[1024];
  snprintf(want, sizeof want, "%.*s", (int)stem, file);
  if (err->message == NULL || strstr(err->message, want) == NULL) {
    fprintf(stderr, "%s: the message does not name the file: %s\n", file,
            err->message ? err->message : "(none)");
    ++mismatches;
  }
}

static const char* outcome(int rc, st_error* err) {
  return rc == ST_OK ? "OK" : st_error_kind_name(err->kind);
}

/* Reads every tensor of `f`: whole, zero-copy (when mapped) and as a selection of everything. */
static int read_every_tensor(const st_file* f, st_error* err) {
  st_file_desc d;
  size_t i;
  int rc = st_file_describe(f, &d, err);
  for (i = 0; rc == ST_OK && i < d.tensor_count; ++i) {
    st_str name;
    st_tensor info;
    st_slice* slice = NULL;
    unsigned char *whole = NULL, *part = NULL;
    if ((rc = st_file_key(f, i, ST_ORDER_SORTED, &name, err)) != ST_OK) break;
    if ((rc = st_file_info(f, name.ptr, name.len, &info, err)) != ST_OK) break;
    whole = (unsigned char*)malloc(info.byte_size + 1);
    part = (unsigned char*)malloc(info.byte_size + 1);
    rc = st_file_read(f, name.ptr, name.len, whole, info.byte_size, err);
    if (rc == ST_OK) rc = st_file_slice(f, name.ptr, name.len, NULL, 0, &slice, err);
    if (rc == ST_OK) rc = st_slice_read(slice, part, info.byte_size, err);
    if (rc == ST_OK && (memcmp(whole, part, info.byte_size) != 0 ||
                        (info.data != NULL && memcmp(whole, info.data, info.byte_size) != 0))) {
      fprintf(stderr, "tensor %.*s: the whole, zero-copy and sliced bytes differ\n", (int)name.len, name.ptr);
      ++mismatches;
    }
    st_slice_free(slice);
    free(whole);
    free(part);
  }
  return rc;
}

static int released = 0;
static void release(void* owner) {
  ++released;
  free(owner);
}

/* Opens `path` the way `how` says and reads every tensor. */
static const char* read_all(const char* path, const char* file, const char* how, st_error* err) {
  st_file* f = NULL;
  int rc;
  if (strcmp(how, "checkpoint") == 0) {
    st_checkpoint* c = NULL;
    st_checkpoint_desc d;
    size_t i;
    rc = st_checkpoint_open(path, 0, &c, err);
    if (rc == ST_OK) rc = st_checkpoint_describe(c, &d, err);
    for (i = 0; rc == ST_OK && i < d.tensor_count; ++i) {
      st_str name;
      st_tensor info;
      unsigned char* bytes;
      if ((rc = st_checkpoint_key(c, i, &name, err)) != ST_OK) break;
      if ((rc = st_checkpoint_info(c, name.ptr, name.len, &info, err)) != ST_OK) break;
      bytes = (unsigned char*)malloc(info.byte_size + 1);
      rc = st_checkpoint_read(c, name.ptr, name.len, bytes, info.byte_size, err);
      free(bytes);
    }
    st_checkpoint_free(c);
    return outcome(rc, err);
  }
  if (strcmp(how, "memory") == 0) {
    size_t size = 0;
    unsigned char* bytes = read_file(path, &size);
    if (bytes == NULL) return "OK"; /* directories, FIFOs, missing files: nothing to hold */
    released = 0;
    rc = st_file_open_memory(bytes, size, file, 0, release, bytes, &f, err);
    if (rc == ST_OK) rc = read_every_tensor(f, err);
    st_file_free(f);
    if (released != 1) {
      fprintf(stderr, "%s: the owner of the bytes was released %d times\n", file, released);
      ++mismatches;
    }
    return outcome(rc, err);
  }
  rc = st_file_open(path,
                    strcmp(how, "read") == 0     ? ST_BACKEND_READ
                    : strcmp(how, "direct") == 0 ? ST_BACKEND_DIRECT
                                                 : ST_BACKEND_MMAP,
                    &f, err);
  if (rc == ST_OK) rc = read_every_tensor(f, err);
  st_file_free(f);
  return outcome(rc, err);
}

/* Streams every tensor of `path` (a budget of 4 KiB, as the C++ test) and checks each against a
 * read of the same tensor. */
static const char* stream_all(const char* path, uint32_t backend, st_error* err) {
  st_file* f = NULL;
  st_stream* s = NULL;
  int rc = st_file_open(path, backend, &f, err);
  if (rc == ST_OK) rc = st_stream_file(f, NULL, 0, 4096, 0, &s, err);
  while (rc == ST_OK) {
    st_stream_tensor* t = NULL;
    st_tensor v;
    unsigned char* bytes;
    if ((rc = st_stream_next(s, &t, err)) != ST_OK || t == NULL) break;
    rc = st_stream_tensor_get(t, &v, NULL, NULL, err);
    bytes = (unsigned char*)malloc(v.byte_size + 1);
    if (rc == ST_OK) rc = st_file_read(f, v.name.ptr, v.name.len, bytes, v.byte_size, err);
    if (rc == ST_OK && memcmp(bytes, v.data, v.byte_size) != 0) {
      fprintf(stderr, "%s: streamed %.*s differs from its read\n", path, (int)v.name.len, v.name.ptr);
      ++mismatches;
    }
    free(bytes);
    st_stream_tensor_free(t);
  }
  st_stream_free(s);
  st_file_free(f);
  return outcome(rc, err);
}

int main(int argc, char** argv) {
  static const char* const ways[] = {"mmap", "read", "direct", "memory", "checkpoint"};
  static const char* const streams[] = {"stream-mmap", "stream-read", "stream-direct"};
  static const uint32_t stream_backends[] = {ST_BACKEND_MMAP, ST_BACKEND_READ, ST_BACKEND_DIRECT};
  char line[2048];
  FILE* manifest;
  size_t files = 0, w;
  if (argc != 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR (with manifest.tsv)\n", argv[0]);
    return 2;
  }
  manifest = fopen(path_in(argv[1], "manifest.tsv"), "r");
  if (manifest == NULL) {
    perror("manifest.tsv");
    return 2;
  }
  while (fgets(line, sizeof line, manifest) != NULL) {
    char path[4096];
    char* file = line;
    char* kind = strchr(line, '\t');
    char* end;
    if (kind == NULL) continue;
    *kind++ = 0;
    end = strchr(kind, '\t');
    if (end != NULL) *end = 0;
    snprintf(path, sizeof path, "%s", path_in(argv[1], file));
    for (w = 0; w < 8; ++w) {
      st_error err = ST_ERROR_INIT;
      const char* how = w < 5 ? ways[w] : streams[w - 5];
      const char* got =
          w < 5 ? read_all(path, file, how, &err) : stream_all(path, stream_backends[w - 5], &err);
      printf("%s\t%s\t%s\n", file, how, got);
      /* The corpus's kinds are the file's; a checkpoint of it is compared with C++ only. */
      if (strcmp(how, "checkpoint") != 0 && strcmp(got, kind) != 0 &&
          !(strcmp(how, "memory") == 0 && !is_regular(path))) {
        fprintf(stderr, "%s (%s): %s, expected %s: %s\n", file, how, got, kind,
                err.message ? err.message : "");
        ++mismatches;
      }
      if (strcmp(got, "OK") != 0 && strcmp(how, "checkpoint") != 0) check_named(&err, file);
      st_error_clear(&err);
    }
    ++files;
  }
  fclose(manifest);
  fprintf(stderr, "C API: %zu corpus files, %d mismatches\n", files, mismatches);
  return files > 100 && mismatches == 0 ? 0 : 1;
}
