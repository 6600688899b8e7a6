//! Writer then parser: whatever the writer accepts parses back to the same tensors and metadata,
//! and writing the parsed file again gives the same bytes.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use safetensors_core::{serialize, Dtype, ErrorKind, SafeTensors, TensorView};

#[derive(Arbitrary, Debug)]
struct Tensor {
    name: String,
    dtype: u8,
    shape: Vec<u8>,
    data: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    tensors: Vec<Tensor>,
    metadata: Option<Vec<(String, String)>>,
}

fuzz_target!(|input: Input| {
    let mut shapes = Vec::new();
    let mut datas = Vec::new();
    let mut dtypes = Vec::new();
    for t in input.tensors.iter().take(16) {
        let dtype = Dtype::ALL[usize::from(t.dtype) % Dtype::ALL.len()];
        let shape: Vec<usize> = t.shape.iter().take(4).map(|&d| usize::from(d % 9)).collect();
        let bytes = dtype.byte_size(shape.iter().product()).unwrap_or(t.data.len());
        let mut data = t.data.clone();
        data.resize(bytes, 0xA5);
        shapes.push(shape);
        datas.push(data);
        dtypes.push(dtype);
    }
    let views: Vec<(&str, TensorView)> = input
        .tensors
        .iter()
        .take(16)
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), TensorView::new(dtypes[i], &shapes[i], &datas[i])))
        .collect();
    let metadata: Option<BTreeMap<String, String>> = input.metadata.map(|m| m.into_iter().collect());
    let bytes = match serialize(views.clone(), metadata.as_ref()) {
        Ok(b) => b,
        Err(e) => {
            // Only what the writer documents it refuses.
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::DuplicateKey | ErrorKind::InvalidTensorName | ErrorKind::MisalignedSlice
                ),
                "unexpected writer error {e}"
            );
            return;
        }
    };
    let file = SafeTensors::deserialize(&bytes).expect("the writer's output must parse");
    assert_eq!(file.header().len(), views.len());
    for (name, v) in &views {
        let back = file.tensor(name).unwrap();
        assert_eq!((back.dtype, back.shape, back.data), (v.dtype, v.shape, v.data));
    }
    let expected_meta = metadata.filter(|m| !m.is_empty() || !views.is_empty());
    assert_eq!(file.header().metadata(), expected_meta.as_ref());
    let again = serialize(file.tensors(), file.header().metadata()).unwrap();
    assert_eq!(again, bytes);
});
