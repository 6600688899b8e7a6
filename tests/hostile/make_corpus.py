#!/usr/bin/env python3
"""Writes the hostile-file corpus: every malformed case of FORMAT.md and what an attacker adds.

    make_corpus.py DIR

Writes DIR/<case>.safetensors files (plus a directory and a FIFO) and DIR/manifest.tsv, one line
per case: `<file name>\t<expected kind>\t<what it is>`, where the kind is an ErrorKind name, or
`OK` for files that must open (lenient cases and look-alikes). The Rust tests
(rust/core/tests/hostile.rs) and the C++ tests (tests/cpp/hostile_test.cpp) run every case with
both backends; the fuzz targets use the files as seeds.

Standard library only, so that any python3 can build it.
"""
import json
import os
import struct
import sys

CASES = []


def case(name, kind, what, data):
    CASES.append((name, kind, what, data))


def prefix(n):
    return struct.pack("<Q", n)


def file(header, data_len=None, data=None, pad=True):
    """A file with `header` (str or bytes) and data of `data_len` counting bytes (or `data`)."""
    h = header.encode() if isinstance(header, str) else header
    if pad and len(h) % 8:
        h += b" " * (8 - len(h) % 8)
    if data is None:
        data = bytes(i % 251 for i in range(data_len or 0))
    return prefix(len(h)) + h + data


def entry(name, dtype, shape, b, e):
    return f'"{name}":{{"dtype":"{dtype}","shape":{json.dumps(shape)},"data_offsets":[{b},{e}]}}'


def obj(*entries):
    return "{" + ",".join(entries) + "}"


ONE = obj(entry("a", "F32", [2], 0, 8))


def build():
    # -- the length prefix ----------------------------------------------------------------------
    case("empty", "HeaderTooSmall", "an empty file", b"")
    for n in (1, 7):
        case(f"short_{n}", "HeaderTooSmall", f"{n} bytes", bytes(range(n)))
    for n, label in ((2**64 - 1, "u64_max"), (2**63, "2_63"), (2**64 - 8, "2_64_minus_8"),
                     (100_000_001, "limit_plus_1"), (2**32, "2_32")):
        case(f"length_{label}", "HeaderTooLarge", f"length prefix {n}", prefix(n) + b"{}")
    case("git_lfs_pointer", "HeaderTooLarge", "a git-lfs pointer file instead of the model",
         b"version https://git-lfs.github.com/spec/v1\n"
         b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 548105171\n")
    case("length_at_limit_short_file", "InvalidHeaderLength", "exactly 100,000,000, but the file is short",
         prefix(100_000_000) + b"{}")
    case("length_past_end", "InvalidHeaderLength", "header runs past the end", prefix(64) + b"{}")
    case("length_one_past_end", "InvalidHeaderLength", "header one byte longer than the file",
         prefix(len(ONE) + 1) + ONE.encode())

    # -- UTF-8 ----------------------------------------------------------------------------------
    for label, junk in (("lone_continuation", b"\x80"), ("overlong_slash", b"\xc0\xaf"),
                        ("surrogate", b"\xed\xa0\x80"), ("truncated_sequence", b"\xe2\x82"),
                        ("byte_ff", b"\xff")):
        case(f"utf8_{label}", "InvalidHeader", f"non-UTF-8 bytes ({label}) in a tensor name",
             file(b'{"' + junk + b'":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1))

    # -- JSON outside the schema ----------------------------------------------------------------
    bad_json = {
        "root_array": "[]", "root_string": '"x"', "root_number": "1", "root_null": "null",
        "trailing_comma": ONE[:-1] + ",}", "comment": "{/* c */" + ONE[1:],
        "trailing_garbage": ONE + " x", "two_objects": ONE + ONE, "unterminated_string": '{"a',
        "unterminated_object": ONE[:-1], "bad_escape": '{"a\\x":1}', "lone_surrogate_escape": '{"\\ud800":1}',
        "control_char_in_name": '{"a\x01":' + ONE[5:],
        "missing_dtype": '{"a":{"shape":[2],"data_offsets":[0,8]}}',
        "missing_shape": '{"a":{"dtype":"F32","data_offsets":[0,8]}}',
        "missing_offsets": '{"a":{"dtype":"F32","shape":[2]}}',
        "unknown_dtype": obj(entry("a", "F33", [2], 0, 8)), "lowercase_dtype": obj(entry("a", "f32", [2], 0, 8)),
        "dtype_number": '{"a":{"dtype":17,"shape":[2],"data_offsets":[0,8]}}',
        "negative_dim": obj(entry("a", "F32", [-2], 0, 8)), "float_dim": '{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}',
        "exponent_dim": '{"a":{"dtype":"F32","shape":[2e0],"data_offsets":[0,8]}}',
        "huge_number": '{"a":{"dtype":"F32","shape":[1e400],"data_offsets":[0,8]}}',
        "hundred_digits": '{"a":{"dtype":"F32","shape":[' + "9" * 100 + '],"data_offsets":[0,8]}}',
        "u64_plus_one": '{"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]}}',
        "offsets_one": '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}}',
        "offsets_three": '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}',
        "offsets_strings": '{"a":{"dtype":"F32","shape":[2],"data_offsets":["0","8"]}}',
        "shape_object": '{"a":{"dtype":"F32","shape":{"0":2},"data_offsets":[0,8]}}',
        "tensor_is_number": '{"a":5}', "metadata_number_value": '{"__metadata__":{"k":1}}',
        "metadata_array": '{"__metadata__":[]}', "metadata_nested": '{"__metadata__":{"k":{"j":"v"}}}',
        "repeated_field": '{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
        "deep_nesting_200": '{"a":' + "[" * 200 + "]" * 200 + "}",
        "deep_nesting_100000": '{"a":' + "[" * 100000 + "]" * 100000 + "}",
        "deep_unclosed": '{"a":' + "[" * 50000,
    }
    for label, text in bad_json.items():
        case(f"json_{label}", "InvalidHeaderDeserialization", label.replace("_", " "), file(text, 8))
    case("json_nul_padding", "InvalidHeaderDeserialization", "NUL padding instead of spaces",
         file(ONE.encode() + b"\0\0\0", 8, pad=False))
    case("json_bom", "InvalidHeaderDeserialization", "a byte-order mark", file("\ufeff" + ONE, 8))

    # -- offsets --------------------------------------------------------------------------------
    case("offset_gap", "InvalidOffset", "a gap between tensors",
         file(obj(entry("a", "U8", [2], 0, 2), entry("b", "U8", [2], 3, 5)), 5))
    case("offset_overlap", "InvalidOffset", "overlapping tensors",
         file(obj(entry("a", "U8", [2], 0, 2), entry("b", "U8", [2], 1, 3)), 3))
    case("offset_same_range", "InvalidOffset", "two tensors on the same bytes",
         file(obj(entry("a", "U8", [2], 0, 2), entry("b", "U8", [2], 0, 2)), 2))
    case("offset_hole_at_start", "InvalidOffset", "the first tensor starts after 0",
         file(obj(entry("a", "U8", [2], 2, 4)), 4))
    case("offset_reversed", "InvalidOffset", "end before begin",
         file(obj(entry("z", "U8", [0], 0, 0), entry("a", "U8", [2], 2, 0)), 2))
    big = 2**64 - 4
    case("offset_wraps", "InvalidOffset", "offsets that would wrap around 2^64",
         file(obj(entry("a", "U8", [2], 0, 2), entry("b", "U8", [6], big, (big + 6) % 2**64)), 8))
    case("offset_near_2_64", "InvalidOffset", "a tensor placed near 2^64",
         file(obj(entry("a", "U8", [4], 2**64 - 5, 2**64 - 1)), 4))

    # -- sizes ----------------------------------------------------------------------------------
    case("shape_overflow_left", "ValidationOverflow", "[2^32, 2^32, 0]: overflows before the zero",
         file(obj(entry("a", "U8", [2**32, 2**32, 0], 0, 0)), 0))
    case("shape_overflow_right", "ValidationOverflow", "[3, 2^32, 2^32]",
         file(obj(entry("a", "U8", [3, 2**32, 2**32], 0, 0)), 0))
    case("shape_bits_overflow", "ValidationOverflow", "element count fits, bits do not",
         file(obj(entry("a", "F64", [2**61], 0, 0)), 0))
    case("shape_many_dims", "ValidationOverflow", "64 dimensions of 2",
         file(obj(entry("a", "U8", [2] * 64, 0, 0)), 0))
    case("subbyte_f4_odd", "MisalignedSlice", "3 F4 elements: a half byte",
         file(obj(entry("a", "F4", [3], 0, 2)), 2))
    case("subbyte_f6_two", "MisalignedSlice", "2 F6 elements: 12 bits",
         file(obj(entry("a", "F6_E2M3", [2], 0, 2)), 2))
    case("size_mismatch", "TensorInvalidInfo", "offsets disagree with dtype x shape",
         file(obj(entry("a", "F32", [2], 0, 7)), 7))
    case("size_mismatch_huge", "TensorInvalidInfo", "a tiny shape claiming petabytes",
         file(obj(entry("a", "U8", [1], 0, 2**50)), 0))

    # -- the data buffer ------------------------------------------------------------------------
    case("data_truncated", "MetadataIncompleteBuffer", "bytes missing at the end (truncated download)",
         file(ONE, 5))
    case("data_trailing", "MetadataIncompleteBuffer", "bytes after the last tensor (a polyglot file)",
         file(ONE, 9))
    case("data_end_near_2_64", "MetadataIncompleteBuffer", "eight tensors ending at 2^64 - 8",
         file(obj(*(entry(f"t{i}", "U8", [2**61 - 1], i * (2**61 - 1), (i + 1) * (2**61 - 1)) for i in range(8))), 0))
    good = file(obj('"__metadata__":{"format":"pt"}', entry("a", "F32", [2, 2], 0, 16),
                    entry("b", "F4", [4], 16, 18), entry("c", "I16", [3], 18, 24)), 24)
    n = struct.unpack("<Q", good[:8])[0]
    for cut in sorted({0, 4, 7, 8, 9, 8 + n // 2, 8 + n - 1, 8 + n, 8 + n + 1, 8 + n + 16, len(good) - 1}):
        kind = ("HeaderTooSmall" if cut < 8 else "InvalidHeaderLength" if cut < 8 + n
                else "MetadataIncompleteBuffer")
        case(f"truncated_at_{cut}", kind, f"a valid file cut after {cut} of {len(good)} bytes", good[:cut])
    case("valid_reference", "OK", "the file the truncation cases cut", good)

    # -- duplicates (stricter than the reference, on purpose) ------------------------------------
    case("duplicate_tensor", "DuplicateKey", "the same tensor name twice",
         file(obj(entry("a", "U8", [1], 0, 1), entry("a", "U8", [1], 1, 2)), 2))
    case("duplicate_metadata_key", "DuplicateKey", "a repeated key in __metadata__",
         file('{"__metadata__":{"k":"1","k":"2"}}', 0))
    case("duplicate_metadata_block", "DuplicateKey", "__metadata__ twice",
         file('{"__metadata__":{"k":"1"},"__metadata__":{"j":"2"}}', 0))
    case("duplicate_escaped_name", "DuplicateKey", "the same name, once escaped",
         file('{"ab":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
              '"a\\u0062":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', 2))

    # -- look-alikes that must open (the reference's leniency) -----------------------------------
    case("ok_ten_byte_file", "OK", "N = 2, header {}", prefix(2) + b"{}")
    case("ok_leading_whitespace", "OK", "whitespace before the object", file(" \t\n\r" + ONE, 8))
    case("ok_tab_padding", "OK", "padding with tabs and newlines", file(ONE + "\t\n\r ", 8, pad=False))
    case("ok_unknown_fields", "OK", "extra fields in an entry",
         file('{"a":{"x":[1,{"y":null}],"dtype":"F32","shape":[2],"data_offsets":[0,8],"z":"q"}}', 8))
    case("ok_null_metadata", "OK", '"__metadata__": null', file('{"__metadata__":null,' + ONE[1:], 8))
    case("ok_zero_size_shared_offset", "OK", "zero-size tensors sharing offsets",
         file(obj(entry("z", "F32", [0], 0, 0), entry("a", "F32", [2], 0, 8), entry("y", "U8", [3, 0], 8, 8)), 8))
    case("ok_unaligned_header", "OK", "N not a multiple of 8", file(ONE + " ", 8, pad=False))
    case("ok_zero_first_dim", "OK", "[0, 2^32, 2^32]: product 0 before any overflow",
         file(obj(entry("a", "U8", [0, 2**32, 2**32], 0, 0)), 0))
    case("ok_array_entry", "OK", "an entry as a 3-element array (serde accepts it)",
         file('{"a":["F32",[2],[0,8]]}', 8))
    case("ok_tagged_dtype", "OK", 'a dtype as {"F32": null} (serde accepts it)',
         file('{"a":{"dtype":{"F32":null},"shape":[2],"data_offsets":[0,8]}}', 8))
    case("ok_escaped_names", "OK", "escapes and non-ASCII in names and metadata",
         file('{"__metadata__":{"k\\n":"v\\u00e9"},"w\\u0000/\\"x":{"dtype":"U8","shape":[],"data_offsets":[0,1]},'
              '"\u4e2d":{"dtype":"U8","shape":[],"data_offsets":[1,2]}}', 2))
    many = ",".join(entry(f"t{i}", "U8", [1], i, i + 1) for i in range(20000))
    case("ok_20000_tensors", "OK", "20,000 one-byte tensors", file("{" + many + "}", 20000))


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    out = argv[1]
    os.makedirs(out, exist_ok=True)
    build()
    lines = []
    for name, kind, what, data in CASES:
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)
        lines.append(f"{name}.safetensors\t{kind}\t{what}")
    # Not regular files: opening them must fail at once (a FIFO must not block the reader).
    os.makedirs(os.path.join(out, "a_directory.safetensors"), exist_ok=True)
    lines.append("a_directory.safetensors\tIo\ta directory")
    fifo = os.path.join(out, "a_fifo.safetensors")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    lines.append("a_fifo.safetensors\tIo\ta FIFO (would block a naive reader)")
    lines.append("does_not_exist.safetensors\tIo\ta missing file")
    with open(os.path.join(out, "manifest.tsv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} cases in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
