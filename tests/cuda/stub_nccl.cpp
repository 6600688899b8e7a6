// A shared library with NCCL's entry points and no NCCL behind them, for tests of how the library
// loads NCCL (safetensors/nccl.hpp): that every entry point resolves, and that the library stays
// loaded once used. Each call succeeds and does nothing; communicators are dummies.
#include <cstddef>

extern "C" {

struct ncclUniqueId {
  char internal[128];
};

__attribute__((visibility("default"))) const char* ncclGetErrorString(int) {
  return "stub NCCL";
}
__attribute__((visibility("default"))) int ncclGetUniqueId(ncclUniqueId*) {
  return 0;
}
__attribute__((visibility("default"))) int ncclCommInitRank(void** comm, int, ncclUniqueId, int) {
  static int dummy = 0;
  *comm = &dummy;
  return 0;
}
__attribute__((visibility("default"))) int ncclCommDestroy(void*) {
  return 0;
}
__attribute__((visibility("default"))) int ncclBroadcast(const void*, void*, std::size_t, int, int, void*,
                                                         void*) {
  return 0;
}
__attribute__((visibility("default"))) int ncclAllGather(const void*, void*, std::size_t, int, void*, void*) {
  return 0;
}
}
