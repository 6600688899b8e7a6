//! The hostile-file corpus (tests/hostile/make_corpus.py): every case gets exactly its expected
//! error kind, with both backends, and the look-alikes open.

mod common;

use safetensors_core::{Backend, OpenOptions, SafeFile};

#[test]
fn every_hostile_file_gets_its_expected_error_kind() {
    let dir = common::hostile_corpus("hostile_corpus");
    let manifest = std::fs::read_to_string(dir.join("manifest.tsv")).unwrap();
    let mut checked = 0;
    for line in manifest.lines() {
        let mut cols = line.split('\t');
        let (name, want, what) = (
            cols.next().unwrap(),
            cols.next().unwrap(),
            cols.next().unwrap(),
        );
        for backend in [Backend::Mmap, Backend::Read, Backend::Direct] {
            let got = match SafeFile::open(dir.join(name), backend) {
                Ok(f) => {
                    // Opened files must also read back every tensor without error.
                    for info in f.header().iter() {
                        let bytes = f.tensor_bytes(info.name).unwrap();
                        assert_eq!(bytes.len(), info.byte_len(), "{name}");
                    }
                    "OK".to_string()
                }
                Err(e) => {
                    assert!(
                        e.to_string()
                            .contains(name.trim_end_matches(".safetensors")),
                        "{name}: {e}"
                    );
                    e.kind().name().to_string()
                }
            };
            assert_eq!(got, want, "{name} ({what}) with {backend:?}");
            checked += 1;
        }
        // The same bytes in memory: the same kind, and the error names what the caller named.
        // (Missing paths, directories, FIFOs and devices have no bytes to hold: they are file cases only.)
        if !std::fs::metadata(dir.join(name)).is_ok_and(|m| m.is_file()) {
            continue;
        }
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let got = match SafeFile::from_memory(name, Box::new(bytes), OpenOptions::default()) {
            Ok(f) => {
                for info in f.header().iter() {
                    let bytes = f.tensor_bytes(info.name).unwrap();
                    assert_eq!(bytes.len(), info.byte_len(), "{name} in memory");
                }
                "OK".to_string()
            }
            Err(e) => {
                assert!(e.to_string().contains(name), "{name} in memory: {e}");
                e.kind().name().to_string()
            }
        };
        assert_eq!(got, want, "{name} ({what}) in memory");
        checked += 1;
    }
    assert!(checked > 300, "{checked}");
}
