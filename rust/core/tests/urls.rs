//! The one URL rule for paths: a path whose text is a URL is refused by every local open (a
//! file, a checkpoint, its index) with an `Io` error saying to open it as a remote file, and
//! showing it without its secrets. Before, `http://host/m` was opened as the local file
//! `http:/host/m` (the kernel folds `//`), so a file of that name was read in the URL's place.

use safetensors_core::{
    serialize_to_file, Backend, Checkpoint, Dtype, ErrorKind, OpenOptions, SafeFile, TensorView,
};

#[test]
fn a_url_given_as_a_path_is_refused_as_a_url() {
    for url in [
        "http://127.0.0.1:9/m.safetensors",
        "https://user:hunter2@host/m.safetensors?sig=secret123",
        "s3://bucket/models/m.safetensors",
        "HTTP://host/model.safetensors.index.json",
    ] {
        let errors = [
            SafeFile::open_with(url, OpenOptions::default()).err(),
            SafeFile::open_with(
                url,
                OpenOptions {
                    backend: Backend::Read,
                    ..OpenOptions::default()
                },
            )
            .err(),
            Checkpoint::open(url, Backend::Mmap).err(),
        ];
        for e in errors {
            let e = e.expect("refused");
            assert_eq!(e.kind(), ErrorKind::Io, "{url}: {e}");
            let text = e.to_string();
            assert!(text.contains("a URL, not a local path"), "{url}: {text}");
            assert!(
                !text.contains("hunter2") && !text.contains("secret123"),
                "{text}"
            );
        }
    }
}

#[test]
fn a_url_given_as_a_path_to_write_is_refused_as_a_url() {
    let data = [1u8, 2];
    let views = [("w", TensorView::new(Dtype::U8, &[2], &data))];
    for url in [
        "http://127.0.0.1:9/m.safetensors",
        "s3://b/k:pass@x/m.safetensors",
    ] {
        let e = serialize_to_file(views, None, url).expect_err("refused");
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        assert!(e.to_string().contains("a URL, not a local path"), "{e}");
        // Nothing was made locally in its place.
        assert!(!std::path::Path::new("http:").exists() && !std::path::Path::new("s3:").exists());
    }
}

#[test]
fn a_path_that_only_looks_like_a_url_is_a_path() {
    // No `://` after a scheme we read: a local path, opened (and here missing) as one.
    for path in [
        "models/http:/x.safetensors",
        "./s3://x.safetensors",
        "ftp://x.safetensors",
    ] {
        let e = SafeFile::open_with(path, OpenOptions::default())
            .err()
            .expect("missing");
        assert!(!e.to_string().contains("a URL"), "{path}: {e}");
    }
}
