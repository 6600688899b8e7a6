/* A stand-in libcuda.so for a machine that has the NVIDIA driver library but no GPU: cuInit
 * fails with CUDA_ERROR_NO_DEVICE (100), as the real driver does there. Lets CI test that path
 * on machines without any driver. */
int cuInit(unsigned int flags) {
  (void)flags;
  return 100;
}

int cuDeviceGetCount(int* count) {
  *count = 0;
  return 100;
}
