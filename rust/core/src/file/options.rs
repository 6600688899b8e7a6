//! How a file is opened: the backend that reaches its tensor bytes, when a mapping's pages are
//! brought in, and the options of [`SafeFile::open_with`](super::SafeFile::open_with).

#[cfg(doc)]
use super::SafeFile;

/// How a [`SafeFile`] reaches tensor bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Backend {
    /// Map the file read-only; views point into the mapping (zero copy). The default.
    #[default]
    Mmap = 0,
    /// Read the header at open, then read tensor bytes with `pread` when asked. For network
    /// filesystems, unified-memory machines, and files another process may truncate.
    Read = 1,
    /// Like `Read`, but with `O_DIRECT` (bypassing the page cache) into aligned buffers, for
    /// cold loads at the disk's speed; falls back to `pread` where the filesystem refuses
    /// `O_DIRECT` ([`SafeFile::direct_fallback`] says why). See `direct.rs`. A file holds two
    /// descriptors for its life; a checkpoint shard holds none between reads.
    Direct = 2,
}

/// When a mapped file's pages are read in and mapped into the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Populate {
    /// On first touch, page by page (the kernel's page faults). The default. A file opened
    /// on its own is also mapped only at the first access of tensor bytes, so that an open
    /// that reads only the header maps nothing (see `LazyMap` in `file.rs`).
    #[default]
    Lazy = 0,
    /// At open (`MAP_POPULATE`): the open returns once every page of the file is read and
    /// mapped, so that no later access faults.
    AtOpen = 1,
    /// After the open, by a thread of its own (`MADV_POPULATE_READ`, 64 MiB at a time; on
    /// kernels before 5.14, `MADV_WILLNEED`), while the program goes on. It stops when the
    /// file is closed; a failure (a file truncated meanwhile) ends it quietly, and the access
    /// that meets the missing pages reports it as without populating.
    Background = 2,
}

/// Options for [`SafeFile::open_with`] and [`SafeFile::from_memory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenOptions {
    /// How tensor bytes are reached (ignored for bytes in memory).
    pub backend: Backend,
    /// Accept bytes after the last tensor (some tools append them; ComfyUI #15599). Off by
    /// default: they are `MetadataIncompleteBuffer`, since they usually mean a file that was
    /// written wrongly. When on, the count is kept and reported by
    /// [`SafeFile::trailing_bytes`], never silently dropped; every other check still runs.
    pub allow_trailing_bytes: bool,
    /// When the mapping's pages are brought in. Only the mapped backend maps anything: the
    /// read and direct backends and bytes in memory ignore it.
    pub populate: Populate,
    /// Ask for transparent huge pages on the mapping (`MADV_HUGEPAGE`): fewer page faults and
    /// TLB misses where the kernel and the filesystem back file mappings with huge pages, no
    /// effect elsewhere (the advice is never an error). Ignored as `populate` is.
    pub huge_pages: bool,
}
