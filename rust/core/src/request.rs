//! What a prefetch plan or a stream asks for: whole tensors or slices, from one file or several
//! (a checkpoint's shards, or files opened one by one), resolved once against the headers into
//! items in file order. Both [`crate::Plan::of`] and [`crate::TensorStream::open`] start here,
//! so a request means the same bytes to both.

use std::sync::Arc;

use crate::checkpoint::Checkpoint;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::file::SafeFile;
use crate::slice::{Indexer, SlicePlan};

/// The files a plan or a stream reads, numbered: a checkpoint's shards (by shard index), or
/// files opened one by one (by position in the slice). "File order" is this numbering, then
/// data offsets ascending within each file.
///
/// Resolving requests against a checkpoint opens (and validates, once; the checkpoint keeps
/// them) every shard a request touches: where a tensor lies is only known from its shard's
/// header. A prefetch then needs nothing more than each file's path and data offsets: it reads
/// through descriptors of its own and creates no views.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    /// A checkpoint: its index says which shard holds each name.
    Checkpoint(&'a Checkpoint),
    /// Files in the given order.
    Files(&'a [Arc<SafeFile>]),
}

/// One requested tensor: whole, or the bytes a slice of it selects (packed in row-major order,
/// exactly what [`SafeFile::read_slice`] gives).
///
/// ```
/// use safetensors_core::{Indexer, Request};
/// let whole = Request::tensor("wte.weight");
/// let rows = Request::slice("wpe.weight", vec![Indexer::range(0, 512)]).in_file(1);
/// # let _ = (whole, rows);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The tensor's name.
    pub name: String,
    /// Which file holds it, in the source's numbering. `None`: for a checkpoint, the shard its
    /// index names; for a list of files, the first that holds the name. For a checkpoint, a
    /// number other than the index's shard is `TensorNotFound` in that shard.
    pub file: Option<usize>,
    /// The slice to take (as [`SafeFile::plan_slice`] takes it); `None` for the whole tensor.
    pub slice: Option<Vec<Indexer>>,
}

impl Request {
    /// The whole tensor `name`.
    pub fn tensor(name: impl Into<String>) -> Request {
        Request {
            name: name.into(),
            file: None,
            slice: None,
        }
    }

    /// The slice `indexers` of tensor `name`.
    pub fn slice(name: impl Into<String>, indexers: Vec<Indexer>) -> Request {
        Request {
            slice: Some(indexers),
            ..Request::tensor(name)
        }
    }

    /// The same request, in file `file` of the source.
    pub fn in_file(self, file: usize) -> Request {
        Request {
            file: Some(file),
            ..self
        }
    }
}

/// A request resolved against its file's header.
pub(crate) struct Item {
    /// Position in the request list (for a whole source: in file order).
    pub request: usize,
    /// The file, in the source's numbering, and the file itself.
    pub file: usize,
    pub source: Arc<SafeFile>,
    /// The tensor's position in its file, in offset order.
    pub position: usize,
    pub name: String,
    pub dtype: Dtype,
    /// Shape of what is delivered (the slice's for a slice).
    pub shape: Vec<usize>,
    /// The tensor's first byte in its file's data buffer.
    pub begin: u64,
    /// Bytes delivered.
    pub len: u64,
    pub slice: Option<SlicePlan>,
}

impl Item {
    /// The data-buffer byte runs this item reads, ascending: the one rule by which plans and
    /// streams turn a request into bytes. Walked lazily: a strided slice has as many runs as
    /// elements.
    pub fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let whole = (self.slice.is_none() && self.len > 0).then_some((self.begin, self.len));
        let sliced = self.slice.iter().flat_map(move |plan| {
            plan.runs()
                .map(move |(offset, len)| (self.begin + offset as u64, len as u64))
        });
        whole.into_iter().chain(sliced)
    }
}

impl Source<'_> {
    fn count(&self) -> usize {
        match self {
            Source::Checkpoint(c) => c.shard_count(),
            Source::Files(files) => files.len(),
        }
    }

    /// File `i`, opened (a checkpoint's shard is opened on first use).
    fn file(&self, i: usize) -> Result<Arc<SafeFile>> {
        match self {
            Source::Checkpoint(c) => c.shard(i).cloned(),
            Source::Files(files) => files
                .get(i)
                .cloned()
                .ok_or_else(|| not_found_beyond("", i, files.len())),
        }
    }

    /// Which file holds `name`.
    fn locate(&self, name: &str, file: Option<usize>) -> Result<usize> {
        let not_found = || Error::TensorNotFound {
            name: name.to_owned(),
        };
        match (self, file) {
            (Source::Checkpoint(c), want) => {
                let i = c.shard_holding(name)?;
                match want {
                    // A shard number past the end holds nothing: the same kind as for a list of
                    // files, rather than the index's `InvalidIndex` (the index is fine).
                    Some(w) if w >= c.shard_count() => {
                        Err(not_found_beyond(name, w, c.shard_count()))
                    }
                    Some(w) if w != i => Err(not_found().in_file(c.shard(w)?.path())),
                    _ => Ok(i),
                }
            }
            (Source::Files(files), Some(i)) => {
                let f = files
                    .get(i)
                    .ok_or_else(|| not_found_beyond(name, i, files.len()))?;
                match f.header().position(name) {
                    Some(_) => Ok(i),
                    None => Err(not_found().in_file(f.path())),
                }
            }
            (Source::Files(files), None) => files
                .iter()
                .position(|f| f.header().position(name).is_some())
                .ok_or_else(not_found),
        }
    }
}

/// A file (or shard) number past the end: there is no file to name, so the error says which
/// number was asked for among how many.
fn not_found_beyond(name: &str, i: usize, count: usize) -> Error {
    Error::TensorNotFound {
        name: name.to_owned(),
    }
    .in_file(std::path::Path::new(&format!(
        "file #{i} of {count} (numbered from 0)"
    )))
}

/// Resolves `requests` (`None`: every tensor of the source) into items sorted in file order
/// (file, then offset, then request position). Whole checkpoint: every tensor its index lists
/// that its shard holds, shard by shard (in lenient mode, tensors a stale index lists but the
/// shard lacks are left out: [`Checkpoint::missing`] names them).
pub(crate) fn resolve(source: Source<'_>, requests: Option<&[Request]>) -> Result<Vec<Item>> {
    if let (Source::Checkpoint(c), Some(requests)) = (source, requests) {
        // Every shard the requests name, opened at once (several in parallel) rather than one
        // by one as the loop below meets them. Errors are left to the loop, which names the
        // request.
        let mut shards: Vec<usize> = requests
            .iter()
            .filter_map(|r| c.shard_of(&r.name).ok())
            .collect();
        shards.sort_unstable();
        shards.dedup();
        let _ = c.open_shards(&shards);
    }
    let mut items = match requests {
        Some(requests) => requests
            .iter()
            .enumerate()
            .map(|(k, r)| {
                let i = source.locate(&r.name, r.file)?;
                let file = source.file(i)?;
                item(k, i, file, &r.name, r.slice.as_deref())
            })
            .collect::<Result<Vec<Item>>>()?,
        None => whole(source)?,
    };
    items.sort_by_key(|it| (it.file, it.begin, it.request));
    if requests.is_none() {
        for (k, it) in items.iter_mut().enumerate() {
            it.request = k;
        }
    }
    Ok(items)
}

/// Every tensor of the source, in file order.
fn whole(source: Source<'_>) -> Result<Vec<Item>> {
    let mut items = Vec::new();
    if let Source::Checkpoint(c) = source {
        c.open_all_shards()?;
        for i in 0..c.shard_count() {
            let file = source.file(i)?;
            // The entries the index assigns to this shard: unlisted tensors, and copies the
            // index assigns elsewhere, are not the checkpoint's.
            for &entry in c.shard_entries(i)? {
                let name = file
                    .header()
                    .name_at(entry)
                    .ok_or_else(|| Error::Internal {
                        message: format!("entry {entry} of shard {i} is past its last"),
                    })?;
                items.push(item(items.len(), i, file.clone(), name, None)?);
            }
        }
        return Ok(items);
    }
    for i in 0..source.count() {
        let file = source.file(i)?;
        for info in file.header().iter() {
            items.push(item(items.len(), i, file.clone(), info.name, None)?);
        }
    }
    Ok(items)
}

fn item(
    request: usize,
    file: usize,
    source: Arc<SafeFile>,
    name: &str,
    slice: Option<&[Indexer]>,
) -> Result<Item> {
    let position = source.header().position(name).ok_or_else(|| {
        Error::TensorNotFound {
            name: name.to_owned(),
        }
        .in_file(source.path())
    })?;
    let info = source
        .header()
        .at(position)
        .ok_or_else(|| Error::Internal {
            message: format!("tensor `{name}` has a position but no entry"),
        })?;
    let (shape, len, slice) = match slice {
        None => (info.shape.to_vec(), info.byte_len() as u64, None),
        Some(indexers) => {
            let plan = SlicePlan::new(&info, indexers).map_err(|e| e.in_file(source.path()))?;
            (plan.shape().to_vec(), plan.byte_len() as u64, Some(plan))
        }
    };
    Ok(Item {
        request,
        file,
        position,
        name: name.to_owned(),
        dtype: info.dtype,
        shape,
        begin: info.data_offsets.0 as u64,
        len,
        slice,
        source,
    })
}
