/* The CUDA entry points of the C API. With `gpu` (run against the emulated driver with two
 * devices, or a real one): every tensor of a file, a checkpoint's selection, through the shared
 * one-shot uploader, an uploader of its own and into a caller's allocation, on both devices,
 * each placement's device bytes equal to the file's; a destination too small or misaligned is
 * ST_ERR_CUDA. With `unavailable` (a driver without a GPU, or a build without CUDA): every CUDA
 * call is ST_ERR_CUDA with a message saying why, and upload plans still work.
 *
 *   c_cuda_test gpu|unavailable WORK_DIR */
#include "support.h"

#include <stdint.h>

static void* at(void* base, uint64_t offset) {
  return (void*)((uintptr_t)base + (uintptr_t)offset);
}

/* Every placement of `plan` in device memory `dptr` on `device` equals the file's bytes. */
static void check_device_bytes(const st_file* f, const st_upload_plan* plan, size_t device, void* dptr) {
  size_t count = 0, i;
  OK(st_upload_plan_describe(plan, &count, NULL, err));
  CHECK(count > 0);
  for (i = 0; i < count; ++i) {
    st_placement p;
    unsigned char *host, *want;
    OK(st_upload_plan_placement(plan, i, &p, err));
    host = (unsigned char*)malloc(p.byte_size + 1);
    want = (unsigned char*)malloc(p.byte_size + 1);
    memset(host, 0xAB, p.byte_size);
    OK(st_cuda_copy_to_host(device, at(dptr, p.offset), host, p.byte_size, err));
    OK(st_file_read(f, p.name.ptr, p.name.len, want, p.byte_size, err));
    CHECK(memcmp(host, want, p.byte_size) == 0);
    free(host);
    free(want);
  }
}

static const char* write_fixture(const char* work) {
  static char path[4096];
  static unsigned char a[1000];
  static float b[64 * 33];
  static const size_t a_shape[1] = {1000}, b_shape[2] = {64, 33}, c_shape[1] = {0};
  st_tensor t[3];
  size_t i;
  for (i = 0; i < sizeof a; ++i) a[i] = (unsigned char)(i * 7);
  for (i = 0; i < 64 * 33; ++i) b[i] = (float)i * 0.5f;
  memset(t, 0, sizeof t);
  t[0].name.ptr = "a";
  t[0].name.len = 1;
  t[0].dtype = ST_DTYPE_U8;
  t[0].rank = 1;
  t[0].shape = a_shape;
  t[0].data = a;
  t[0].byte_size = sizeof a;
  t[1] = t[0];
  t[1].name.ptr = "b";
  t[1].dtype = ST_DTYPE_F32;
  t[1].rank = 2;
  t[1].shape = b_shape;
  t[1].data = b;
  t[1].byte_size = sizeof b;
  t[2] = t[0];
  t[2].name.ptr = "c";
  t[2].shape = c_shape;
  t[2].data = NULL;
  t[2].byte_size = 0;
  make_dir(work);
  snprintf(path, sizeof path, "%s", path_in(work, "cuda.safetensors"));
  OK(st_save_file(path, t, 3, NULL, 0, ST_SAVE_NO_SYNC, err));
  return path;
}

static void test_gpu(const char* path) {
  st_file *mapped = NULL, *read = NULL;
  st_checkpoint* c = NULL;
  st_upload_plan *plan = NULL, *rows = NULL;
  st_uploader* u = NULL;
  st_request r;
  st_index row = st_select(3);
  size_t devices = 0, count = 0;
  uint64_t total = 0;
  void *dptr = NULL, *dst = NULL;
  float got[33], want[33];
  CHECK(st_cuda_built());
  OK(st_cuda_device_count(&devices, err));
  CHECK(devices >= 1);
  OK(st_file_open(path, ST_BACKEND_MMAP, &mapped, err));
  OK(st_file_open(path, ST_BACKEND_READ, &read, err));
  if (mapped == NULL || read == NULL) return;

  /* One-shot, every tensor, into a new allocation. */
  OK(st_upload_plan_file(mapped, NULL, 0, 0, &plan, err));
  OK(st_upload_plan_describe(plan, &count, &total, err));
  CHECK(count == 3 && total >= 1000 + 64 * 33 * 4);
  OK(st_cuda_load(0, plan, &dptr, err));
  CHECK(dptr != NULL);
  check_device_bytes(mapped, plan, 0, dptr);
  OK(st_cuda_free(0, dptr, err));
  st_upload_plan_free(plan);

  /* An uploader of its own, from the read backend; then into its allocation again. */
  OK(st_uploader_new(0, 2, 4096, 2, &u, err));
  OK(st_upload_plan_file(read, NULL, 0, 0, &plan, err));
  OK(st_uploader_load(u, plan, &dst, err));
  check_device_bytes(read, plan, 0, dst);
  OK(st_uploader_load_into(u, plan, dst, (size_t)total, 0, err));
  OK(st_uploader_synchronize(u, err));
  check_device_bytes(read, plan, 0, dst);
  FAILS(ST_ERR_CUDA, st_uploader_load_into(u, plan, dst, (size_t)total - 1, 0, err));
  CHECK(strstr(last_message, "holds") != NULL);
  FAILS(ST_ERR_CUDA, st_uploader_load_into(u, plan, at(dst, 1), (size_t)total - 1, 0, err));
  OK(st_cuda_free(0, dst, err));
  st_uploader_free(u);
  /* Its two pinned buffers of 4096 bytes wait idle for the next upload until released. */
  {
    size_t released = 0;
    OK(st_cuda_release_staging(0, &released, err));
    CHECK(released >= 2 * 4096);
    OK(st_cuda_release_staging(0, &released, err));
    CHECK(released == 0);
    OK(st_cuda_release_staging(0, NULL, err));
  }

  /* A selection of a checkpoint's tensor, on the second device when there is one. */
  OK(st_checkpoint_open(path, ST_BACKEND_READ, &c, err));
  memset(&r, 0, sizeof r);
  r.name.ptr = "b";
  r.name.len = 1;
  r.indices = &row;
  r.index_count = 1;
  OK(st_upload_plan_checkpoint(c, &r, 1, 0, &rows, err));
  st_checkpoint_free(c);
  OK(st_cuda_load(devices - 1, rows, &dptr, err));
  OK(st_cuda_copy_to_host(devices - 1, dptr, got, sizeof got, err));
  {
    st_slice* s = NULL;
    OK(st_file_slice(mapped, ST_LITERAL("b"), &row, 1, &s, err));
    OK(st_slice_read(s, want, sizeof want, err));
    st_slice_free(s);
  }
  CHECK(memcmp(got, want, sizeof got) == 0 && got[0] == 3 * 33 * 0.5f);
  OK(st_cuda_free(devices - 1, dptr, err));
  st_upload_plan_free(rows);
  st_upload_plan_free(plan);
  st_file_free(mapped);
  st_file_free(read);
}

static void test_unavailable(const char* path) {
  st_file* f = NULL;
  st_upload_plan* plan = NULL;
  st_uploader* u = NULL;
  size_t devices = 0, count = 0;
  void* dptr = NULL;
  unsigned char host[4];
  FAILS(ST_ERR_CUDA, st_cuda_device_count(&devices, err));
  if (!st_cuda_built()) CHECK(strstr(last_message, "no CUDA support") != NULL);
  OK(st_file_open(path, 0, &f, err));
  /* Planning needs no GPU. */
  OK(st_upload_plan_file(f, NULL, 0, 0, &plan, err));
  OK(st_upload_plan_describe(plan, &count, NULL, err));
  CHECK(count == 3);
  FAILS(ST_ERR_CUDA, st_cuda_load(0, plan, &dptr, err));
  CHECK(dptr == NULL);
  FAILS(ST_ERR_CUDA, st_uploader_new(0, 0, 0, 0, &u, err));
  CHECK(u == NULL);
  FAILS(ST_ERR_CUDA, st_cuda_free(0, (void*)(uintptr_t)4096, err));
  FAILS(ST_ERR_CUDA, st_cuda_copy_to_host(0, (void*)(uintptr_t)4096, host, sizeof host, err));
  FAILS(ST_ERR_INTERNAL, st_uploader_synchronize(NULL, err));
  if (st_cuda_built()) {
    size_t released = 7;
    OK(st_cuda_release_staging(0, &released, err)); /* nothing was ever pinned */
    CHECK(released == 0);
  } else {
    FAILS(ST_ERR_CUDA, st_cuda_release_staging(0, NULL, err));
  }
  st_upload_plan_free(plan);
  st_file_free(f);
}

int main(int argc, char** argv) {
  const char* path;
  if (argc != 3 || (strcmp(argv[1], "gpu") != 0 && strcmp(argv[1], "unavailable") != 0)) {
    fprintf(stderr, "usage: %s gpu|unavailable WORK_DIR\n", argv[0]);
    return 2;
  }
  path = write_fixture(argv[2]);
  if (strcmp(argv[1], "gpu") == 0) {
    test_gpu(path);
  } else {
    test_unavailable(path);
  }
  if (test_failures > 0) {
    fprintf(stderr, "%d checks failed\n", test_failures);
    return 1;
  }
  printf("all C CUDA checks passed (%s)\n", argv[1]);
  return 0;
}
