/* One input, one error, whoever owns the output: the C API's conversions and dequantizations
 * write into the caller's buffer, and for every bad input of the table they give the kind the
 * allocating C++ calls give (tests/cpp/convert_test.cpp) and the core's sizing gives
 * (rust/core/tests/buffer_kinds.rs), with destinations of every length; a conversion's output is
 * sized with st_tensor_byte_size, which gives the same kind too. No message quotes a size that
 * does not exist (a wrapped 18446744073709551615).
 *
 *   c_convert_kinds_test */
#include "support.h"

#include <stdint.h>

#define BIG ((size_t)1 << 40)

/* Room enough for every input of the table: inputs are zeros, at most 64 bytes. */
static const unsigned char zeros[64];

/* One tensor of the table: dtype, shape (at most 3 dimensions), bytes it really holds. */
typedef struct {
  int32_t dtype;
  size_t rank;
  size_t shape[3];
  size_t bytes;
} given;

static st_tensor tensor_of(const given* g) {
  st_tensor t;
  memset(&t, 0, sizeof t);
  t.name.ptr = "t";
  t.name.len = 1;
  t.dtype = g->dtype;
  t.rank = g->rank;
  t.shape = g->shape;
  t.data = zeros;
  t.byte_size = g->bytes;
  return t;
}

enum op { CONVERT, FP8_BLOCKS, MXFP4 };

typedef struct {
  const char* what;
  enum op op;
  given a, b; /* the source (or weight, or blocks), and the scale (or scales) */
  size_t block_rows, block_cols;
  int32_t to;
  int32_t kind;
} row;

/* One row a line: a table. */
/* clang-format off */
static const row table[] = {
    /* Sub-byte outputs and sources whose elements end inside a byte: no buffer fits them. */
    {"3 values into F4", CONVERT, {ST_DTYPE_F32, 1, {3}, 12}, {0}, 0, 0, ST_DTYPE_F4, ST_ERR_MISALIGNED_SLICE},
    {"3 values into F6_E2M3", CONVERT, {ST_DTYPE_F32, 1, {3}, 12}, {0}, 0, 0, ST_DTYPE_F6_E2M3, ST_ERR_MISALIGNED_SLICE},
    {"2 values into F6_E3M2", CONVERT, {ST_DTYPE_F32, 1, {2}, 8}, {0}, 0, 0, ST_DTYPE_F6_E3M2, ST_ERR_MISALIGNED_SLICE},
    {"3 F4 values", CONVERT, {ST_DTYPE_F4, 1, {3}, 2}, {0}, 0, 0, ST_DTYPE_F32, ST_ERR_MISALIGNED_SLICE},
    /* Sizes that do not fit in 64 bits: of the elements, or of their bits. */
    {"elements overflow", CONVERT, {ST_DTYPE_F32, 2, {BIG, BIG}, 8}, {0}, 0, 0, ST_DTYPE_F64, ST_ERR_VALIDATION_OVERFLOW},
    {"bits overflow", CONVERT, {ST_DTYPE_F64, 1, {SIZE_MAX / 4}, 8}, {0}, 0, 0, ST_DTYPE_F32, ST_ERR_VALIDATION_OVERFLOW},
    /* A source whose bytes disagree with its dtype and shape; pairs that are no conversion. */
    {"short source", CONVERT, {ST_DTYPE_F32, 1, {3}, 8}, {0}, 0, 0, ST_DTYPE_F16, ST_ERR_TENSOR_INVALID_INFO},
    {"lying source", CONVERT, {ST_DTYPE_F8_E4M3, 1, {BIG}, 4}, {0}, 0, 0, ST_DTYPE_F32, ST_ERR_TENSOR_INVALID_INFO},
    {"complex source, lying", CONVERT, {ST_DTYPE_C64, 1, {BIG}, 4}, {0}, 0, 0, ST_DTYPE_F32, ST_ERR_TYPE_MISMATCH},
    {"integer target", CONVERT, {ST_DTYPE_F32, 1, {1}, 4}, {0}, 0, 0, ST_DTYPE_I32, ST_ERR_TYPE_MISMATCH},
    /* Block dequantization. */
    {"fp8 into F4, odd count", FP8_BLOCKS, {ST_DTYPE_F8_E4M3, 2, {1, 3}, 3}, {ST_DTYPE_F32, 2, {1, 1}, 4}, 128, 128, ST_DTYPE_F4, ST_ERR_TYPE_MISMATCH},
    {"fp8 into F4, even count", FP8_BLOCKS, {ST_DTYPE_F8_E4M3, 2, {1, 4}, 4}, {ST_DTYPE_F32, 2, {1, 1}, 4}, 128, 128, ST_DTYPE_F4, ST_ERR_TYPE_MISMATCH},
    {"fp8 lying weight", FP8_BLOCKS, {ST_DTYPE_F8_E4M3, 2, {1 << 20, 1 << 20}, 4}, {ST_DTYPE_F32, 2, {8192, 8192}, 4}, 128, 128, ST_DTYPE_F32, ST_ERR_TENSOR_INVALID_INFO},
    {"fp8 lying scale", FP8_BLOCKS, {ST_DTYPE_F8_E4M3, 2, {1, 4}, 4}, {ST_DTYPE_F32, 2, {8192, 8192}, 4}, 128, 128, ST_DTYPE_F32, ST_ERR_TENSOR_INVALID_INFO},
    {"fp8 half-byte scale", FP8_BLOCKS, {ST_DTYPE_F8_E4M3, 2, {1, 4}, 4}, {ST_DTYPE_F4, 2, {1, 1}, 1}, 128, 128, ST_DTYPE_F32, ST_ERR_MISALIGNED_SLICE},
    {"fp8 scale of the wrong shape", FP8_BLOCKS, {ST_DTYPE_F8_E4M3, 2, {1, 4}, 4}, {ST_DTYPE_F32, 2, {2, 2}, 16}, 128, 128, ST_DTYPE_F32, ST_ERR_TYPE_MISMATCH},
    /* MXFP4. */
    {"mxfp4 into F4", MXFP4, {ST_DTYPE_U8, 2, {1, 16}, 16}, {ST_DTYPE_U8, 1, {1}, 1}, 0, 0, ST_DTYPE_F4, ST_ERR_TYPE_MISMATCH},
    {"mxfp4 lying blocks", MXFP4, {ST_DTYPE_U8, 2, {BIG, 16}, 4}, {ST_DTYPE_U8, 1, {BIG}, 4}, 0, 0, ST_DTYPE_F32, ST_ERR_TENSOR_INVALID_INFO},
    {"mxfp4 lying scales", MXFP4, {ST_DTYPE_U8, 2, {1, 16}, 16}, {ST_DTYPE_U8, 1, {BIG}, 4}, 0, 0, ST_DTYPE_F32, ST_ERR_TENSOR_INVALID_INFO},
    {"mxfp4 groups of 15", MXFP4, {ST_DTYPE_U8, 2, {1, 15}, 15}, {ST_DTYPE_U8, 1, {1}, 1}, 0, 0, ST_DTYPE_F32, ST_ERR_TYPE_MISMATCH},
};
/* clang-format on */

/* The call of row `r` into `len` bytes of `dst`. */
static int call(const row* r, void* dst, size_t len, st_error* err) {
  st_tensor a = tensor_of(&r->a), b = tensor_of(&r->b);
  switch (r->op) {
    case CONVERT:
      return st_convert(&a, r->to, dst, len, err);
    case FP8_BLOCKS:
      return st_dequantize_fp8_blocks(&a, &b, r->block_rows, r->block_cols, r->to, dst, len, err);
    case MXFP4:
      return st_dequantize_mxfp4(&a, &b, r->to, dst, len, err);
  }
  return ST_OK;
}

/* A message the table allows: not empty, and quoting no wrapped size. */
static void check_message(const char* what, const char* message) {
  if (message[0] == 0 || strstr(message, "18446744073709551615") != NULL) {
    fprintf(stderr, "%s: message \"%s\"\n", what, message);
    ++test_failures;
  }
}

static void test_every_bad_input_has_its_kind_whatever_the_destination(void) {
  static const size_t lens[] = {0, 1, 7, 12, 64};
  unsigned char dst[64];
  size_t i, j, size;
  for (i = 0; i < sizeof table / sizeof table[0]; ++i) {
    const row* r = &table[i];
    for (j = 0; j < sizeof lens / sizeof lens[0]; ++j) {
      memset(dst, 0xAB, sizeof dst);
      FAILS(r->kind, call(r, dst, lens[j], err));
      check_message(r->what, last_message);
      CHECK(dst[0] == 0xAB && dst[lens[j] > 0 ? lens[j] - 1 : 0] == 0xAB); /* nothing written */
    }
    /* A conversion's output is sized by the tensor byte-length rule, which agrees when it is
     * the output that cannot be. */
    if (r->op == CONVERT && r->kind == ST_ERR_MISALIGNED_SLICE && r->a.dtype == ST_DTYPE_F32) {
      FAILS(r->kind, st_tensor_byte_size(r->to, r->a.shape, r->a.rank, &size, err));
      check_message(r->what, last_message);
    }
  }
}

/* Good inputs: a destination of another length is TENSOR_INVALID_INFO naming it, with both
 * sizes; the length st_tensor_byte_size gives is the one that works. */
static void test_a_destination_of_another_length_names_both_sizes(void) {
  static const float four[4] = {1, 2, 3, 4};
  const size_t shape[1] = {4};
  unsigned char dst[16];
  size_t size = 0;
  st_tensor src;
  memset(&src, 0, sizeof src);
  src.name.ptr = "t";
  src.name.len = 1;
  src.dtype = ST_DTYPE_F32;
  src.rank = 1;
  src.shape = shape;
  src.data = four;
  src.byte_size = sizeof four;
  OK(st_tensor_byte_size(ST_DTYPE_F4, shape, 1, &size, err));
  CHECK(size == 2);
  OK(st_convert(&src, ST_DTYPE_F4, dst, size, err));
  FAILS(ST_ERR_TENSOR_INVALID_INFO, st_convert(&src, ST_DTYPE_F4, dst, 3, err));
  CHECK(strstr(last_message, "the destination") != NULL);
  CHECK(strstr(last_message, "make 2 bytes") != NULL && strstr(last_message, "3 bytes") != NULL);
  check_message("F4 destination", last_message);
}

int main(void) {
  test_every_bad_input_has_its_kind_whatever_the_destination();
  test_a_destination_of_another_length_names_both_sizes();
  if (test_failures > 0) {
    fprintf(stderr, "%d checks failed\n", test_failures);
    return 1;
  }
  printf("all C conversion kind checks passed\n");
  return 0;
}
