//! Zero-copy views over a safetensors file that is already in memory.

use crate::byte_len::checked_numel;
use crate::dtype::Dtype;
use crate::error::Result;
use crate::header::{Header, TensorInfo};

/// A tensor's type, shape and bytes, borrowed. Used for reading and as writer input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorView<'a> {
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first.
    pub shape: &'a [usize],
    /// Little-endian, row-major element bytes.
    pub data: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// A view of `data` as a tensor of `dtype` and `shape`; the writer checks that they agree.
    pub fn new(dtype: Dtype, shape: &'a [usize], data: &'a [u8]) -> TensorView<'a> {
        TensorView { dtype, shape, data }
    }

    /// Number of elements (1 for a scalar), or `None` on overflow.
    pub fn numel(&self) -> Option<usize> {
        checked_numel(self.shape)
    }
}

/// A parsed file held in a caller-owned buffer: the header plus zero-copy access to tensors.
///
/// ```
/// use safetensors_core::{serialize, Dtype, SafeTensors, TensorView};
/// let data = [0u8; 16];
/// let bytes = serialize([("w", TensorView::new(Dtype::F32, &[2, 2], &data))], None).unwrap();
/// let file = SafeTensors::deserialize(&bytes).unwrap();
/// assert_eq!(file.tensor("w").unwrap().shape, &[2, 2]);
/// ```
#[derive(Debug)]
pub struct SafeTensors<'a> {
    header: Header,
    data: &'a [u8],
}

impl<'a> SafeTensors<'a> {
    /// Parses and validates `buffer`, which must hold the whole file.
    pub fn deserialize(buffer: &'a [u8]) -> Result<SafeTensors<'a>> {
        let header = Header::parse(buffer)?;
        let data = &buffer[header.data_start()..];
        Ok(SafeTensors { header, data })
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The data buffer: every byte after the header.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let info = self.header.tensor(name)?;
        Ok(view_of(info, self.data))
    }

    /// Every tensor in file order, with its name.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = (&str, TensorView<'_>)> + '_ {
        self.header
            .iter()
            .map(move |info| (info.name, view_of(info, self.data)))
    }
}

/// The view of `info` inside `data`. Validation guarantees every tensor lies inside the buffer.
pub(crate) fn view_of<'a>(info: TensorInfo<'a>, data: &'a [u8]) -> TensorView<'a> {
    TensorView {
        dtype: info.dtype,
        shape: info.shape,
        data: &data[info.data_offsets.0..info.data_offsets.1],
    }
}
