/* Helpers shared by the C tests: checks that report the failing line and the library's message,
 * files and directories. C99 with POSIX, header-only (each test is one program). */
#ifndef SAFETENSORS_TESTS_C_SUPPORT_H
#define SAFETENSORS_TESTS_C_SUPPORT_H

/* POSIX (stat, mkdir) under -std=c99: include this header first. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <safetensors.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int test_failures = 0; /* used by every test's main */

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++test_failures;                                                         \
    }                                                                          \
  } while (0)

/* The call succeeds; otherwise its message is printed. */
#define OK(call)                                                                                     \
  do {                                                                                               \
    st_error ok_err_ = ST_ERROR_INIT;                                                                \
    st_error* err = &ok_err_;                                                                        \
    if ((call) != ST_OK) {                                                                           \
      fprintf(stderr, "%s:%d: %s failed: [%s] %s\n", __FILE__, __LINE__, #call,                      \
              st_error_kind_name(ok_err_.kind), ok_err_.message ? ok_err_.message : "(no message)"); \
      ++test_failures;                                                                               \
    }                                                                                                \
    st_error_clear(err);                                                                             \
  } while (0)

/* The call fails with `kind` (and a message whose length is `message_len`); the message is
 * kept in `last_message` for further checks until the next FAILS. */
static inline char* last_message_buffer(void) {
  static char buffer[4096];
  return buffer;
}
#define last_message (last_message_buffer())
#define FAILS(kind_, call)                                                                                   \
  do {                                                                                                       \
    st_error fails_err_ = ST_ERROR_INIT;                                                                     \
    st_error* err = &fails_err_;                                                                             \
    int rc_ = (call);                                                                                        \
    last_message[0] = 0;                                                                                     \
    if (rc_ != ST_FAILED) {                                                                                  \
      fprintf(stderr, "%s:%d: %s returned %d, expected ST_FAILED with %s\n", __FILE__, __LINE__, #call, rc_, \
              st_error_kind_name(kind_));                                                                    \
      ++test_failures;                                                                                       \
    } else if (fails_err_.kind != (kind_) || fails_err_.message == NULL ||                                   \
               strlen(fails_err_.message) != fails_err_.message_len) {                                       \
      fprintf(stderr, "%s:%d: %s failed with [%s] %s, expected %s\n", __FILE__, __LINE__, #call,             \
              st_error_kind_name(fails_err_.kind), fails_err_.message ? fails_err_.message : "(none)",       \
              st_error_kind_name(kind_));                                                                    \
      ++test_failures;                                                                                       \
    } else {                                                                                                 \
      snprintf(last_message, 4096, "%s", fails_err_.message);                                                \
    }                                                                                                        \
    st_error_clear(err);                                                                                     \
  } while (0)

/* Whether `s` holds exactly the NUL-terminated `text`. */
static inline int str_is(st_str s, const char* text) {
  return s.len == strlen(text) && memcmp(s.ptr, text, s.len) == 0;
}

/* `dir/name` in a static buffer (one at a time). */
static inline const char* path_in(const char* dir, const char* name) {
  static char buf[4096];
  size_t d = strlen(dir), n = strlen(name);
  if (d + 1 + n >= sizeof buf) {
    fprintf(stderr, "path too long: %s/%s\n", dir, name);
    exit(2);
  }
  memcpy(buf, dir, d);
  buf[d] = '/';
  memcpy(buf + d + 1, name, n + 1);
  return buf;
}

/* Makes `dir` (and its parent) if missing. */
static inline void make_dir(const char* dir) {
  char parent[4096];
  const char* slash = strrchr(dir, '/');
  if (slash != NULL && slash != dir) {
    snprintf(parent, sizeof parent, "%.*s", (int)(slash - dir), dir);
    if (mkdir(parent, 0777) != 0 && errno != EEXIST) perror(parent);
  }
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) perror(dir);
}

/* Whether `path` is a regular file (not a directory, a FIFO, or missing). */
static inline int is_regular(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The bytes of a regular file (malloc'd, exactly its size; NULL for anything else), and its size. */
static inline unsigned char* read_file(const char* path, size_t* size) {
  struct stat st;
  FILE* f;
  unsigned char* bytes;
  *size = 0;
  if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return NULL;
  f = fopen(path, "rb");
  if (f == NULL) return NULL;
  bytes = (unsigned char*)malloc(st.st_size > 0 ? (size_t)st.st_size : 1);
  if (bytes != NULL && fread(bytes, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
    free(bytes);
    bytes = NULL;
  }
  fclose(f);
  if (bytes != NULL) *size = (size_t)st.st_size;
  return bytes;
}

/* Writes `size` bytes to `path`. */
static inline void write_file(const char* path, const void* bytes, size_t size) {
  FILE* f = fopen(path, "wb");
  if (f == NULL || fwrite(bytes, 1, size, f) != size) {
    perror(path);
    ++test_failures;
  }
  if (f != NULL) fclose(f);
}

#endif
