//! The one error type of the library, [`Error`], with its stable identity [`ErrorKind`] and its
//! messages.
//!
//! Every variant names what went wrong in terms a user can act on: the file, the tensor, the sizes
//! involved, and a hint where a common cause is known (git-lfs pointer files, truncated
//! downloads). [`ErrorKind`] is the stable, fieldless identity of each variant; the C++ API
//! exposes the same enumerators.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::dtype::Dtype;
use crate::format::{LENGTH_PREFIX_SIZE, MAX_HEADER_SIZE, MAX_RANK, METADATA_KEY};

/// A specialized `Result` for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading, writing or slicing a safetensors file. A clone is the
/// same kind and the same message (see `IoSource`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The input is shorter than the 8-byte header length prefix.
    HeaderTooSmall {
        /// Length of the input in bytes.
        len: u64,
    },
    /// The header length prefix exceeds 100,000,000 bytes (on read), or the header a writer
    /// would produce does (on write).
    HeaderTooLarge {
        /// The header length claimed by the prefix, or produced by the writer.
        header_len: u64,
        /// The input starts like a git-lfs pointer file.
        lfs_pointer: bool,
        /// `Some` when the error comes from a writer: what the header would have held.
        writing: Option<HeaderContents>,
    },
    /// The header length prefix points past the end of the input.
    InvalidHeaderLength {
        /// The header length claimed by the prefix.
        header_len: u64,
        /// Length of the input in bytes.
        len: u64,
    },
    /// The header is not valid UTF-8.
    InvalidHeader {
        /// Offset of the first invalid byte, counted from the start of the header JSON.
        valid_up_to: usize,
    },
    /// The header is not JSON of the safetensors schema.
    InvalidHeaderDeserialization {
        /// What the JSON parser reported, with line and column.
        message: String,
    },
    /// A tensor's `data_offsets` leave a gap, overlap another tensor, or end before they begin.
    InvalidOffset {
        /// The tensor whose offsets are wrong.
        tensor: String,
        /// Its declared offsets.
        data_offsets: (u64, u64),
        /// Where it had to begin to continue the previous tensor.
        expected_begin: u64,
    },
    /// A tensor's element count or bit size does not fit in 64 bits.
    ValidationOverflow {
        /// The tensor with the impossible shape.
        tensor: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A sub-byte tensor, or a slice of one, does not start and end on a byte boundary.
    MisalignedSlice {
        /// The tensor concerned.
        tensor: String,
        /// What is misaligned.
        reason: String,
    },
    /// A tensor's byte length disagrees with its dtype and shape.
    TensorInvalidInfo {
        /// The tensor concerned.
        tensor: String,
        /// Bytes implied by dtype × shape.
        expected: u64,
        /// Bytes actually given (by `data_offsets`, or by the data handed to the writer).
        actual: u64,
    },
    /// A tensor of a file has more than [`crate::MAX_RANK`] dimensions (a limit of this
    /// library; its kind is [`ErrorKind::TensorInvalidInfo`]).
    RankTooLarge {
        /// The tensor concerned.
        tensor: String,
    },
    /// The tensors do not cover the data buffer exactly: bytes are missing or left over.
    MetadataIncompleteBuffer {
        /// File length implied by the header and the last tensor's end offset.
        expected: u64,
        /// Actual length of the input.
        actual: u64,
    },
    /// No tensor has this name.
    TensorNotFound {
        /// The name that was looked up.
        name: String,
    },
    /// A tensor name, or a key inside `__metadata__`, appears twice.
    DuplicateKey {
        /// The repeated name or key.
        key: String,
        /// `true` when the key is inside `__metadata__`.
        in_metadata: bool,
    },
    /// A tensor may not have this name: `__metadata__` is reserved for the metadata map.
    InvalidTensorName {
        /// The refused name.
        name: String,
    },
    /// A slice request does not fit the tensor: too many indexers, or an index out of range.
    InvalidSlice {
        /// The tensor being sliced.
        tensor: String,
        /// What is wrong with the request.
        reason: String,
    },
    /// An operating-system error while opening, reading or writing a file.
    Io {
        /// The file concerned.
        path: PathBuf,
        /// What we were doing, e.g. "open" or "read".
        op: &'static str,
        /// The underlying error.
        source: IoSource,
    },
    /// A sharded-checkpoint index (`*.safetensors.index.json`) is malformed.
    InvalidIndex {
        /// What is wrong with it.
        reason: String,
    },
    /// A shard named by the index, or the tensor it should hold, is missing.
    ShardMissing {
        /// The shard file.
        shard: String,
        /// The tensor that led to it, when one did.
        tensor: Option<String>,
    },
    /// A shard holds a tensor that the index assigns to a different shard.
    ShardMismatch {
        /// The tensor concerned.
        tensor: String,
        /// The shard that holds it.
        found_in: String,
        /// The shard the index assigns it to (none when the index does not list it).
        claimed_by: Option<String>,
    },
    /// A shard path in the index leaves the index's directory (`..`, absolute paths).
    InvalidShardPath {
        /// The refused path.
        shard: String,
    },
    /// CUDA is not available or a CUDA call failed.
    Cuda {
        /// What failed and why.
        message: String,
    },
    /// A dtype conversion or dequantization that makes no sense (complex source, non-float
    /// target, wrong scale shape); its kind is [`ErrorKind::TypeMismatch`].
    Conversion {
        /// The source dtype.
        from: Dtype,
        /// The target dtype.
        to: Dtype,
        /// Why it is refused.
        reason: String,
    },
    /// Text handed to the writer as bytes (by C++) is not UTF-8, which a header, being JSON,
    /// must be. Its kind is [`ErrorKind::InvalidTensorName`] for a tensor name and
    /// [`ErrorKind::InvalidHeader`] for a metadata key or value.
    NotUtf8 {
        /// What the text was to be.
        field: TextField,
        /// The text, each invalid sequence replaced by U+FFFD.
        lossy: String,
        /// Offset of the first invalid byte.
        offset: usize,
        /// That byte.
        byte: u8,
    },
    /// A dtype given by its enumeration value (as C++ passes it) that is no dtype, such as
    /// `static_cast<Dtype>(99)`, for a tensor to write or a conversion. Its kind is
    /// [`ErrorKind::TypeMismatch`].
    InvalidDtypeValue {
        /// The value given (C passes an `int32_t`, C++ a `uint8_t`: any of them is said as
        /// given).
        value: i64,
        /// The tensor to write that has it; `None` for a conversion.
        tensor: Option<String>,
    },
    /// A buffer a caller handed over does not have the length the operation needs; its kind is
    /// [`ErrorKind::InvalidSlice`], the kind of every wrong-size buffer.
    WrongBufferLength {
        /// Which buffer, e.g. "the buffer to serialize into".
        buffer: &'static str,
        /// Bytes needed.
        expected: u64,
        /// Bytes given.
        actual: u64,
    },
    /// An upload's destination would pass 2^64 bytes: placing `tensor` after the bytes before
    /// it, on a multiple of `alignment`, overflows. Its kind is
    /// [`ErrorKind::ValidationOverflow`]; the message blames the alignment when padding to it is
    /// what overflows.
    LayoutOverflow {
        /// The tensor being placed.
        tensor: String,
        /// Bytes placed before it.
        placed: u64,
        /// Its bytes.
        len: u64,
        /// What every tensor's offset must be a multiple of.
        alignment: u64,
    },
    /// A bounded stream cannot go on until the caller drops tensors it was given: the next
    /// tensor does not fit under `max_inflight_bytes` beside those still held, and no other
    /// thread was said to be releasing them (`wait_for_release`).
    BudgetExceeded {
        /// The tensor the stream would deliver next.
        tensor: String,
        /// Bytes of delivered tensors still alive.
        held: u64,
        /// The stream's `max_inflight_bytes`.
        bound: u64,
        /// Bytes the next tensor (or slice) needs.
        next: u64,
    },
    /// A piece of a tensor handed to a streaming writer does not fit what was declared, or a
    /// tensor was not completely written when the writer finished. Its kind depends on the
    /// problem (see [`PieceProblem`]).
    Piece {
        /// The tensor concerned.
        tensor: String,
        /// What is wrong.
        problem: PieceProblem,
    },
    /// An alignment a writer or an upload was asked for that it cannot give (not a power of
    /// two, or one whose padding would pass the header's size limit); its kind is
    /// [`ErrorKind::InvalidSlice`].
    BadAlignment {
        /// The alignment asked for.
        alignment: u64,
        /// Why it cannot be had.
        reason: &'static str,
        /// Whether it was asked of an upload's placements ([`crate::upload::alignment`]), not
        /// of a file's data.
        upload: bool,
    },
    /// An output buffer a caller handed over overlaps the bytes the call reads (see
    /// `overlap.rs`); its kind is [`ErrorKind::InvalidSlice`], the kind of every unfit output
    /// buffer.
    OverlappingOutput {
        /// The call that refused it, as the caller knows it (e.g. `st_convert`, `convert`).
        call: String,
        /// Bytes of the output buffer.
        dst_len: u64,
        /// Bytes the call reads that it overlaps (a tensor, a file in memory).
        src_len: u64,
    },
    /// A broken internal contract: a defect in this library (please report it), or a Rust
    /// caller that ran a plan on other inputs than it was made for.
    Internal {
        /// What was broken.
        message: String,
    },
    /// An error that happened in a named file: the wrapped error says what.
    InFile {
        /// The file.
        path: PathBuf,
        /// What went wrong in it.
        source: Box<Error>,
    },
}

/// What a header that is too large to write is made of, so the message can say which part to
/// shrink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderContents {
    /// Number of tensors.
    pub tensors: usize,
    /// Bytes of all tensor names together.
    pub name_bytes: usize,
    /// Bytes of all metadata keys and values together.
    pub metadata_bytes: usize,
}

/// What a piece of header text handed to the writer was to be (see [`Error::NotUtf8`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextField {
    /// A tensor name.
    TensorName,
    /// A key of `__metadata__`.
    MetadataKey,
    /// A value of `__metadata__`.
    MetadataValue,
}

impl TextField {
    /// How messages name it, e.g. `"tensor name"`.
    pub fn describe(self) -> &'static str {
        match self {
            TextField::TensorName => "tensor name",
            TextField::MetadataKey => "metadata key",
            TextField::MetadataValue => "metadata value",
        }
    }
}

/// What is wrong with a piece handed to a streaming writer (see [`Error::Piece`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceProblem {
    /// The piece `[offset, offset + len)` ends past the tensor's `tensor_len` bytes, or a whole
    /// tensor given at once has `len` bytes instead of `tensor_len`; its kind is
    /// [`ErrorKind::TensorInvalidInfo`].
    Long {
        /// Where the piece starts in the tensor (0 for a whole tensor).
        offset: u64,
        /// Its bytes.
        len: u64,
        /// The tensor's bytes (dtype × shape).
        tensor_len: u64,
        /// `true` for a whole tensor given at once, which must have exactly `tensor_len` bytes.
        whole: bool,
    },
    /// The piece `[offset, offset + len)` overlaps bytes of the tensor already written
    /// (`[written_begin, written_end)`); its kind is [`ErrorKind::InvalidOffset`].
    Overlap {
        /// Where the piece starts in the tensor.
        offset: u64,
        /// Its bytes.
        len: u64,
        /// The written range it overlaps.
        written_begin: u64,
        /// One past its end.
        written_end: u64,
    },
    /// The writer finished with bytes of the tensor never written: `written` of `tensor_len`,
    /// the first gap being `[gap_begin, gap_end)`; its kind is
    /// [`ErrorKind::MetadataIncompleteBuffer`].
    Missing {
        /// Bytes written.
        written: u64,
        /// The tensor's bytes.
        tensor_len: u64,
        /// The first byte never written.
        gap_begin: u64,
        /// One past the end of that gap.
        gap_end: u64,
    },
}

/// The stable identity of an [`Error`], without its details.
///
/// The discriminants are part of the C++ bridge: append new kinds, never reorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ErrorKind {
    /// See [`Error::HeaderTooSmall`].
    HeaderTooSmall = 0,
    /// See [`Error::HeaderTooLarge`].
    HeaderTooLarge = 1,
    /// See [`Error::InvalidHeaderLength`].
    InvalidHeaderLength = 2,
    /// See [`Error::InvalidHeader`].
    InvalidHeader = 3,
    /// See [`Error::InvalidHeaderDeserialization`].
    InvalidHeaderDeserialization = 4,
    /// See [`Error::InvalidOffset`].
    InvalidOffset = 5,
    /// See [`Error::ValidationOverflow`].
    ValidationOverflow = 6,
    /// See [`Error::MisalignedSlice`].
    MisalignedSlice = 7,
    /// See [`Error::TensorInvalidInfo`].
    TensorInvalidInfo = 8,
    /// See [`Error::MetadataIncompleteBuffer`].
    MetadataIncompleteBuffer = 9,
    /// See [`Error::TensorNotFound`].
    TensorNotFound = 10,
    /// See [`Error::DuplicateKey`].
    DuplicateKey = 11,
    /// See [`Error::InvalidTensorName`].
    InvalidTensorName = 12,
    /// See [`Error::InvalidSlice`].
    InvalidSlice = 13,
    /// See [`Error::Io`].
    Io = 14,
    /// See [`Error::InvalidIndex`].
    InvalidIndex = 15,
    /// See [`Error::ShardMissing`].
    ShardMissing = 16,
    /// See [`Error::ShardMismatch`].
    ShardMismatch = 17,
    /// See [`Error::InvalidShardPath`].
    InvalidShardPath = 18,
    /// See [`Error::Cuda`].
    Cuda = 19,
    /// A defect in this library (a caught panic, a broken internal contract); please report it.
    Internal = 20,
    /// `TensorView::as<T>()` (C++) with a `T` whose type, size or alignment does not fit the
    /// tensor, a dtype conversion that makes no sense ([`Error::Conversion`]), or a dtype value
    /// that names no dtype ([`Error::InvalidDtypeValue`]).
    TypeMismatch = 21,
    /// See [`Error::BudgetExceeded`].
    BudgetExceeded = 22,
}

impl ErrorKind {
    /// Every kind, in discriminant order.
    pub const ALL: [ErrorKind; 23] = [
        ErrorKind::HeaderTooSmall,
        ErrorKind::HeaderTooLarge,
        ErrorKind::InvalidHeaderLength,
        ErrorKind::InvalidHeader,
        ErrorKind::InvalidHeaderDeserialization,
        ErrorKind::InvalidOffset,
        ErrorKind::ValidationOverflow,
        ErrorKind::MisalignedSlice,
        ErrorKind::TensorInvalidInfo,
        ErrorKind::MetadataIncompleteBuffer,
        ErrorKind::TensorNotFound,
        ErrorKind::DuplicateKey,
        ErrorKind::InvalidTensorName,
        ErrorKind::InvalidSlice,
        ErrorKind::Io,
        ErrorKind::InvalidIndex,
        ErrorKind::ShardMissing,
        ErrorKind::ShardMismatch,
        ErrorKind::InvalidShardPath,
        ErrorKind::Cuda,
        ErrorKind::Internal,
        ErrorKind::TypeMismatch,
        ErrorKind::BudgetExceeded,
    ];

    /// The kind's name, e.g. `"InvalidOffset"`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::HeaderTooSmall => "HeaderTooSmall",
            ErrorKind::HeaderTooLarge => "HeaderTooLarge",
            ErrorKind::InvalidHeaderLength => "InvalidHeaderLength",
            ErrorKind::InvalidHeader => "InvalidHeader",
            ErrorKind::InvalidHeaderDeserialization => "InvalidHeaderDeserialization",
            ErrorKind::InvalidOffset => "InvalidOffset",
            ErrorKind::ValidationOverflow => "ValidationOverflow",
            ErrorKind::MisalignedSlice => "MisalignedSlice",
            ErrorKind::TensorInvalidInfo => "TensorInvalidInfo",
            ErrorKind::MetadataIncompleteBuffer => "MetadataIncompleteBuffer",
            ErrorKind::TensorNotFound => "TensorNotFound",
            ErrorKind::DuplicateKey => "DuplicateKey",
            ErrorKind::InvalidTensorName => "InvalidTensorName",
            ErrorKind::InvalidSlice => "InvalidSlice",
            ErrorKind::Io => "Io",
            ErrorKind::InvalidIndex => "InvalidIndex",
            ErrorKind::ShardMissing => "ShardMissing",
            ErrorKind::ShardMismatch => "ShardMismatch",
            ErrorKind::InvalidShardPath => "InvalidShardPath",
            ErrorKind::Cuda => "Cuda",
            ErrorKind::Internal => "Internal",
            ErrorKind::TypeMismatch => "TypeMismatch",
            ErrorKind::BudgetExceeded => "BudgetExceeded",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Error {
    /// The kind of this error (looking through [`Error::InFile`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::HeaderTooSmall { .. } => ErrorKind::HeaderTooSmall,
            Error::HeaderTooLarge { .. } => ErrorKind::HeaderTooLarge,
            Error::InvalidHeaderLength { .. } => ErrorKind::InvalidHeaderLength,
            Error::InvalidHeader { .. } => ErrorKind::InvalidHeader,
            Error::InvalidHeaderDeserialization { .. } => ErrorKind::InvalidHeaderDeserialization,
            Error::InvalidOffset { .. } => ErrorKind::InvalidOffset,
            Error::ValidationOverflow { .. } => ErrorKind::ValidationOverflow,
            Error::MisalignedSlice { .. } => ErrorKind::MisalignedSlice,
            Error::TensorInvalidInfo { .. } | Error::RankTooLarge { .. } => {
                ErrorKind::TensorInvalidInfo
            }
            Error::MetadataIncompleteBuffer { .. } => ErrorKind::MetadataIncompleteBuffer,
            Error::TensorNotFound { .. } => ErrorKind::TensorNotFound,
            Error::DuplicateKey { .. } => ErrorKind::DuplicateKey,
            Error::InvalidTensorName { .. } => ErrorKind::InvalidTensorName,
            Error::InvalidSlice { .. } => ErrorKind::InvalidSlice,
            Error::Io { .. } => ErrorKind::Io,
            Error::InvalidIndex { .. } => ErrorKind::InvalidIndex,
            Error::ShardMissing { .. } => ErrorKind::ShardMissing,
            Error::ShardMismatch { .. } => ErrorKind::ShardMismatch,
            Error::InvalidShardPath { .. } => ErrorKind::InvalidShardPath,
            Error::Cuda { .. } => ErrorKind::Cuda,
            Error::Conversion { .. } => ErrorKind::TypeMismatch,
            Error::NotUtf8 {
                field: TextField::TensorName,
                ..
            } => ErrorKind::InvalidTensorName,
            Error::NotUtf8 { .. } => ErrorKind::InvalidHeader,
            // A value that names no dtype is a type error wherever it comes from (never the
            // byte-length kind, which would send the user looking at sizes).
            Error::InvalidDtypeValue { .. } => ErrorKind::TypeMismatch,
            Error::WrongBufferLength { .. } => ErrorKind::InvalidSlice,
            Error::LayoutOverflow { .. } => ErrorKind::ValidationOverflow,
            Error::BudgetExceeded { .. } => ErrorKind::BudgetExceeded,
            Error::Piece { problem, .. } => match problem {
                PieceProblem::Long { .. } => ErrorKind::TensorInvalidInfo,
                PieceProblem::Overlap { .. } => ErrorKind::InvalidOffset,
                PieceProblem::Missing { .. } => ErrorKind::MetadataIncompleteBuffer,
            },
            Error::BadAlignment { .. } => ErrorKind::InvalidSlice,
            Error::OverlappingOutput { .. } => ErrorKind::InvalidSlice,
            Error::Internal { .. } => ErrorKind::Internal,
            Error::InFile { source, .. } => source.kind(),
        }
    }

    /// The file this error is about, when there is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Error::InFile { path, .. } | Error::Io { path, .. } => Some(path),
            _ => None,
        }
    }

    /// The error without its file context.
    pub fn innermost(&self) -> &Error {
        match self {
            Error::InFile { source, .. } => source.innermost(),
            other => other,
        }
    }

    /// Attaches a file path, unless the error already names one.
    pub fn in_file(self, path: &Path) -> Error {
        if self.path().is_some() {
            return self;
        }
        Error::InFile {
            path: path.to_path_buf(),
            source: Box::new(self),
        }
    }

    /// Builds an [`Error::Io`].
    pub fn io(path: &Path, op: &'static str, source: io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            op,
            source: IoSource(source),
        }
    }
}

fn plural(n: u64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// A shape for a message: in full up to 16 dimensions, else the first 12, the last 2 and the
/// rank, so that a hostile rank of millions does not make a message of megabytes.
struct ShortShape<'a>(&'a [usize]);

impl fmt::Display for ShortShape<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        if s.len() <= 16 {
            return write!(f, "{s:?}");
        }
        let head: Vec<String> = s[..12].iter().map(usize::to_string).collect();
        write!(
            f,
            "[{}, ..., {}, {}] (rank {})",
            head.join(", "),
            s[s.len() - 2],
            s[s.len() - 1],
            s.len()
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::HeaderTooSmall { len } => write!(
                f,
                "header too small: the input has {}, fewer than the 8-byte header length \
                 prefix; it is empty or not a safetensors file",
                plural(*len, "byte")
            ),
            Error::HeaderTooLarge {
                header_len,
                writing: Some(parts),
                ..
            } => write!(
                f,
                "header too large to write: the header for {} would take {header_len} bytes, \
                 over the format's {MAX_HEADER_SIZE}-byte limit ({} of tensor names, {} of \
                 metadata); too many tensors, or names or metadata too long: split the tensors \
                 across several files (shards) or shorten the names or metadata",
                plural(parts.tensors as u64, "tensor"),
                plural(parts.name_bytes as u64, "byte"),
                plural(parts.metadata_bytes as u64, "byte")
            ),
            Error::HeaderTooLarge {
                header_len,
                lfs_pointer,
                writing: None,
            } => {
                write!(
                    f,
                    "header too large: the prefix announces {header_len} bytes, over the \
                     {MAX_HEADER_SIZE}-byte limit"
                )?;
                if *lfs_pointer {
                    write!(
                        f,
                        "; hint: this is a git-lfs pointer file, not the model itself: fetch the \
                         real file with `git lfs pull` or download it directly"
                    )
                } else {
                    write!(f, "; the file is corrupt or not a safetensors file")
                }
            }
            Error::InvalidHeaderLength { header_len, len } => write!(
                f,
                "invalid header length: the prefix announces a {header_len}-byte header but only \
                 {} follow it; the file is truncated or not a safetensors file",
                plural(len.saturating_sub(LENGTH_PREFIX_SIZE as u64), "byte")
            ),
            Error::InvalidHeader { valid_up_to } => write!(
                f,
                "invalid header: not UTF-8 (first bad byte at header offset {valid_up_to})"
            ),
            Error::InvalidHeaderDeserialization { message } => {
                write!(f, "invalid header JSON: {message}")
            }
            Error::InvalidOffset {
                tensor,
                data_offsets: (begin, end),
                expected_begin,
            } => {
                write!(
                    f,
                    "invalid offset for tensor `{tensor}`: data_offsets [{begin}, {end}]"
                )?;
                if end < begin {
                    write!(f, " end before they begin")
                } else if begin < expected_begin {
                    write!(
                        f,
                        " overlap the previous tensor, which ends at {expected_begin}"
                    )
                } else {
                    write!(
                        f,
                        " leave a gap: the previous tensor ends at {expected_begin} (tensors must \
                         be packed back to back from offset 0)"
                    )
                }
            }
            Error::ValidationOverflow { tensor, shape } => write!(
                f,
                "validation overflow: tensor `{tensor}` has shape {}, whose size in bits does \
                 not fit in 64 bits",
                ShortShape(shape)
            ),
            Error::MisalignedSlice { tensor, reason } => {
                write!(f, "misaligned tensor `{tensor}`: {reason}")
            }
            Error::TensorInvalidInfo {
                tensor,
                expected,
                actual,
            } => write!(
                f,
                "invalid tensor info for `{tensor}`: dtype and shape make {} but {} are given",
                plural(*expected, "byte"),
                plural(*actual, "byte")
            ),
            Error::RankTooLarge { tensor } => write!(
                f,
                "invalid tensor info for `{tensor}`: more than {MAX_RANK} dimensions; this \
                 library reads and writes tensors of at most {MAX_RANK} (NumPy handles at most 64)"
            ),
            Error::MetadataIncompleteBuffer { expected, actual } => {
                if actual < expected {
                    write!(
                        f,
                        "incomplete file: the header describes {expected} bytes but the file has \
                         {actual} ({} missing); hint: the file is truncated, most likely an \
                         interrupted download: download it again",
                        expected - actual
                    )
                } else {
                    write!(
                        f,
                        "incomplete metadata: the header describes {expected} bytes but the file \
                         has {actual} ({} after the last tensor); the tensors must cover the data \
                         exactly, and trailing data may hide another file format",
                        plural(actual - expected, "extra byte")
                    )
                }
            }
            Error::TensorNotFound { name } => write!(f, "tensor `{name}` not found"),
            Error::DuplicateKey { key, in_metadata } => {
                if *in_metadata {
                    // Also raised for a checkpoint index's `metadata` object, so the text names
                    // no one container (`in_file` adds which file it is).
                    write!(
                        f,
                        "duplicate metadata key `{key}`: each key may appear once (readers \
                         disagree on which copy wins)"
                    )
                } else {
                    write!(
                        f,
                        "duplicate tensor name `{key}`: each name may appear once (readers \
                         disagree on which copy wins)"
                    )
                }
            }
            Error::InvalidTensorName { name } if name == METADATA_KEY => write!(
                f,
                "invalid tensor name `{name}`: `{METADATA_KEY}` is reserved for the metadata map"
            ),
            Error::InvalidTensorName { name } => write!(f, "invalid tensor name `{name}`"),
            // A range of the data buffer rather than of one tensor (`read_data`).
            Error::InvalidSlice { tensor, reason } if tensor.is_empty() => {
                write!(f, "invalid range of the data buffer: {reason}")
            }
            Error::InvalidSlice { tensor, reason } => {
                write!(f, "invalid slice of tensor `{tensor}`: {reason}")
            }
            // Memory that could not be had has no file to name.
            Error::Io { path, op, source } if path.as_os_str().is_empty() => {
                write!(f, "{op} failed: {source}")
            }
            Error::Io { path, op, source } => {
                write!(f, "{}: {op} failed: {source}", path.display())
            }
            Error::InvalidIndex { reason } => write!(f, "invalid checkpoint index: {reason}"),
            Error::ShardMissing { shard, tensor } => {
                write!(f, "shard `{shard}`")?;
                match tensor {
                    Some(t) => write!(
                        f,
                        " does not contain tensor `{t}`, which the index's weight_map assigns to it"
                    ),
                    None => write!(f, " named by the index is missing"),
                }
            }
            Error::ShardMismatch {
                tensor,
                found_in,
                claimed_by,
            } => match claimed_by {
                Some(owner) => write!(
                    f,
                    "tensor `{tensor}` is in shard `{found_in}` but the index's weight_map \
                     assigns it to `{owner}`"
                ),
                None => write!(
                    f,
                    "tensor `{tensor}` is in shard `{found_in}` but the index's weight_map does \
                     not list it"
                ),
            },
            Error::InvalidShardPath { shard } => write!(
                f,
                "invalid shard path `{shard}`: shards must be files inside the index's directory \
                 (no absolute paths, no `..`)"
            ),
            Error::Cuda { message } => write!(f, "CUDA: {message}"),
            Error::Conversion { from, to, reason } => {
                write!(f, "cannot convert {from} to {to}: {reason}")
            }
            Error::NotUtf8 {
                field,
                lossy,
                offset,
                byte,
            } => write!(
                f,
                "{} {lossy:?} is not valid UTF-8 (invalid byte 0x{byte:02x} at offset {offset}); \
                 a safetensors header is UTF-8 JSON, so convert it to UTF-8 first",
                field.describe()
            ),
            Error::InvalidDtypeValue {
                value,
                tensor: Some(tensor),
            } => write!(
                f,
                "tensor `{tensor}` has an invalid dtype value {value} (valid values are 0 to {})",
                Dtype::ALL.len() - 1
            ),
            Error::InvalidDtypeValue {
                value,
                tensor: None,
            } => write!(
                f,
                "dtype index {value} is not a safetensors dtype (there are {})",
                Dtype::ALL.len()
            ),
            Error::WrongBufferLength {
                buffer,
                expected,
                actual,
            } => write!(
                f,
                "wrong buffer length: {buffer} holds {} but {} are needed",
                plural(*actual, "byte"),
                plural(*expected, "byte")
            ),
            Error::LayoutOverflow {
                tensor,
                placed,
                len,
                alignment,
            } => {
                // Without padding the tensor would fit: then the alignment is to blame.
                if placed.checked_add(*len).is_some() {
                    write!(
                        f,
                        "layout overflow: tensor `{tensor}` ({}) cannot start on a multiple of \
                         the alignment, {alignment} bytes, after the {} placed before it \
                         without passing 2^64 bytes; the alignment is absurd: use a small power \
                         of two (CUDA allocations are aligned to 256)",
                        plural(*len, "byte"),
                        plural(*placed, "byte")
                    )
                } else {
                    write!(
                        f,
                        "layout overflow: tensor `{tensor}` ({}) after the {} placed before it \
                         passes 2^64 bytes; upload fewer tensors at once",
                        plural(*len, "byte"),
                        plural(*placed, "byte")
                    )
                }
            }
            Error::BudgetExceeded {
                tensor,
                held,
                bound,
                next,
            } => {
                write!(
                    f,
                    "stream budget exceeded: the caller still holds {} of delivered tensors and \
                     the next one, `{tensor}`, needs {}",
                    plural(*held, "byte"),
                    plural(*next, "byte")
                )?;
                if next > bound {
                    write!(
                        f,
                        ", more than the {bound}-byte max_inflight_bytes on its own, so it is \
                         read only once nothing else is held"
                    )?;
                } else {
                    write!(f, ", over the {bound}-byte max_inflight_bytes together")?;
                }
                write!(
                    f,
                    "; drop delivered tensors before asking for the next one, or raise \
                     max_inflight_bytes (set wait_for_release when other threads drop them)"
                )
            }
            Error::Piece { tensor, problem } => fmt_piece(f, tensor, problem),
            Error::BadAlignment {
                alignment,
                reason,
                upload: true,
            } => write!(
                f,
                "cannot place tensors on multiples of {alignment} bytes: {reason}; use a power \
                 of two, or 0 for the default (256 bytes, what CUDA allocations are aligned to)"
            ),
            Error::BadAlignment {
                alignment, reason, ..
            } => write!(
                f,
                "cannot align the data to {alignment} bytes: {reason}; use a power of two such \
                 as 64 (SIMD) or 4096 (direct I/O), or 0 for the reference layout"
            ),
            Error::OverlappingOutput {
                call,
                dst_len,
                src_len,
            } => write!(
                f,
                "{call}: the destination ({dst_len} bytes) overlaps the bytes it reads ({src_len} \
                 bytes); write into a separate buffer"
            ),
            Error::Internal { message } => write!(
                f,
                "internal error in the safetensors library (please report): {message}"
            ),
            Error::InFile { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

/// The message of an [`Error::Piece`].
fn fmt_piece(f: &mut fmt::Formatter<'_>, tensor: &str, problem: &PieceProblem) -> fmt::Result {
    match *problem {
        PieceProblem::Long {
            len,
            tensor_len,
            whole: true,
            ..
        } => write!(
            f,
            "tensor `{tensor}` was declared with a dtype and shape of {} but {} were given as \
             the whole tensor; give exactly its bytes, or write it in pieces at their offsets",
            plural(tensor_len, "byte"),
            plural(len, "byte")
        ),
        PieceProblem::Long {
            offset,
            len,
            tensor_len,
            ..
        } => write!(
            f,
            "the piece [{offset}, {}) of tensor `{tensor}` ends past its {} (dtype × shape as \
             declared)",
            offset.saturating_add(len),
            plural(tensor_len, "byte")
        ),
        PieceProblem::Overlap {
            offset,
            len,
            written_begin,
            written_end,
        } => write!(
            f,
            "the piece [{offset}, {}) of tensor `{tensor}` overlaps bytes [{written_begin}, \
             {written_end}) already written; each byte is written once",
            offset.saturating_add(len)
        ),
        PieceProblem::Missing {
            written,
            tensor_len,
            gap_begin,
            gap_end,
        } => write!(
            f,
            "tensor `{tensor}` is incomplete: {written} of its {} were written, the first \
             missing being [{gap_begin}, {gap_end}); write every byte before finishing \
             (nothing was published)",
            plural(tensor_len, "byte")
        ),
    }
}

/// The operating system's error inside an [`Error::Io`]: an `io::Error` (reached through
/// `Deref`: `source.kind()`, `source.raw_os_error()`) that can be copied, so that [`Error`] is
/// `Clone` for state machines that report the same error to every later call (streams,
/// prefetches, plans). A copy keeps the OS error code, or else the kind and the text.
pub struct IoSource(pub io::Error);

impl Clone for IoSource {
    fn clone(&self) -> Self {
        IoSource(match self.0.raw_os_error() {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(self.0.kind(), self.0.to_string()),
        })
    }
}

impl std::ops::Deref for IoSource {
    type Target = io::Error;
    fn deref(&self) -> &io::Error {
        &self.0
    }
}

impl From<io::Error> for IoSource {
    fn from(e: io::Error) -> Self {
        IoSource(e)
    }
}

impl fmt::Debug for IoSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for IoSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(&source.0),
            Error::InFile { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_are_unique_and_ordered() {
        for (i, k) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        let mut names: Vec<_> = ErrorKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorKind::ALL.len());
    }

    #[test]
    fn in_file_keeps_the_kind_and_names_the_path() {
        let e = Error::TensorNotFound { name: "w".into() }.in_file(Path::new("/m/a.safetensors"));
        assert_eq!(e.kind(), ErrorKind::TensorNotFound);
        assert_eq!(e.path(), Some(Path::new("/m/a.safetensors")));
        assert_eq!(e.to_string(), "/m/a.safetensors: tensor `w` not found");
        // A second path does not stack.
        let again = e.in_file(Path::new("/other"));
        assert_eq!(again.path(), Some(Path::new("/m/a.safetensors")));
    }
}
