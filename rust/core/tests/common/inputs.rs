//! Test and benchmark inputs that are too big to commit.

/// A file whose header is as close to the 100,000,000-byte limit as tiny U8 entries get
/// (`"t1234":{"dtype":"U8","shape":[],"data_offsets":[k,k+1]}`, ~1.5 M tensors), with its data.
/// Returns the file and the number of tensors.
#[allow(dead_code)]
pub fn tiny_entries_at_the_limit() -> (Vec<u8>, usize) {
    let mut json = String::with_capacity(safetensors_core::MAX_HEADER_SIZE);
    json.push('{');
    let mut count = 0usize;
    loop {
        let e = format!(
            "\"t{count}\":{{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[{count},{}]}}",
            count + 1
        );
        if json.len() + e.len() + 2 > safetensors_core::MAX_HEADER_SIZE {
            break;
        }
        if count > 0 {
            json.push(',');
        }
        json.push_str(&e);
        count += 1;
    }
    json.push('}');
    let mut out = Vec::with_capacity(8 + json.len() + count);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    out.resize(out.len() + count, 7);
    (out, count)
}
