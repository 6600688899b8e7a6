//! What the atomic writer does to the path it replaces: long names, modes, owners, symlinks,
//! special files, the temporary file's visibility, and what a too-large header is called.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::scratch_dir;
use safetensors_core::{
    serialize_to_file, write_atomically, Dtype, ErrorKind, Header, PreparedFile, TensorView,
    MAX_HEADER_SIZE,
};

fn save(path: &Path, value: u8) -> safetensors_core::Result<()> {
    let data = [value; 4];
    serialize_to_file([("w", TensorView::new(Dtype::U8, &[4], &data))], None, path)
}

fn saved_value(path: &Path) -> u8 {
    let bytes = fs::read(path).unwrap();
    let header = Header::parse(&bytes).unwrap();
    bytes[header.data_start()]
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Whether `dir`'s filesystem gives unnamed temporary files (tmpfs, ext4, xfs, btrfs do).
fn supports_o_tmpfile(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    fs::File::options()
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
        .is_ok()
}

#[test]
fn saves_file_names_of_every_legal_length() {
    let dir = scratch_dir("writer_long_names");
    for len in [4, 200, 243, 244, 250, 255] {
        let name = format!("{}.st", "n".repeat(len - 3));
        assert_eq!(name.len(), len);
        let path = dir.join(&name);
        save(&path, 1).unwrap_or_else(|e| panic!("{len}-byte name: {e}"));
        save(&path, 2).unwrap_or_else(|e| panic!("{len}-byte name, replacing: {e}"));
        assert_eq!(saved_value(&path), 2);
    }
    assert_eq!(listing(&dir).len(), 6, "{:?}", listing(&dir));
}

#[test]
fn keeps_an_existing_files_mode_exactly() {
    let dir = scratch_dir("writer_modes");
    for mode in [
        0o600, 0o444, 0o640, 0o751, 0o604, 0o1644, 0o2750, 0o4755, 0o6711, 0o000,
    ] {
        let path = dir.join(format!("m{mode:o}.safetensors"));
        save(&path, 1).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        save(&path, 2).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(
            meta.mode() & 0o7777,
            mode,
            "{mode:o} became {:o}",
            meta.mode()
        );
        if mode & 0o444 != 0 || is_root() {
            assert_eq!(saved_value(&path), 2);
        }
    }
}

#[test]
fn a_new_file_gets_0666_minus_the_umask() {
    let dir = scratch_dir("writer_new_mode");
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let umask = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .map(|v| u32::from_str_radix(v.trim(), 8).unwrap())
        .expect("Umask in /proc/self/status");
    let path = dir.join("new.safetensors");
    save(&path, 1).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o666 & !umask);
}

fn is_root() -> bool {
    // SAFETY: a plain syscall without arguments.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn keeps_an_existing_files_owner_and_group_where_permitted() {
    let dir = scratch_dir("writer_owner");
    let path = dir.join("owned.safetensors");
    save(&path, 1).unwrap();
    if !is_root() {
        // Without privileges the file is ours anyway; the group stays ours too.
        let before = fs::metadata(&path).unwrap();
        save(&path, 2).unwrap();
        let after = fs::metadata(&path).unwrap();
        assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
        common_skip_note("not root: cannot give the file to another owner");
        return;
    }
    let (uid, gid) = (4242, 4343);
    std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o6750)).unwrap();
    save(&path, 2).unwrap();
    let meta = fs::metadata(&path).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (uid, gid));
    assert_eq!(meta.mode() & 0o7777, 0o6750);
    assert_eq!(saved_value(&path), 2);
}

fn common_skip_note(why: &str) {
    eprintln!("PARTLY SKIPPED: {why}");
}

#[test]
fn the_temporary_file_is_never_visible_while_writing() {
    // A writer killed at any point while writing leaves nothing behind when its temporary file
    // has no name: the directory holds only the old target throughout.
    let dir = scratch_dir("writer_unnamed_temp");
    let path = dir.join("t.safetensors");
    save(&path, 1).unwrap();
    if !supports_o_tmpfile(&dir) {
        common_skip_note("this filesystem has no O_TMPFILE; the named fallback is used");
        return;
    }
    let mut seen = Vec::new();
    write_atomically(&path, |out| {
        seen = listing(&dir);
        out.write_all(&fs::read(&path)?)
    })
    .unwrap();
    assert_eq!(seen, ["t.safetensors"]);
    assert_eq!(listing(&dir), ["t.safetensors"]);
}

#[test]
fn a_failed_write_leaves_the_target_and_no_temporary_file() {
    let dir = scratch_dir("writer_failed_fill");
    let path = dir.join("t.safetensors");
    save(&path, 1).unwrap();
    let err = write_atomically(&path, |out| {
        out.write_all(&[0; 100])?;
        Err(io::Error::other("the source went away"))
    })
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert!(err.to_string().contains("the source went away"), "{err}");
    assert_eq!(saved_value(&path), 1);
    assert_eq!(listing(&dir), ["t.safetensors"]);
}

#[test]
fn writes_through_a_symlink_and_keeps_the_link() {
    let dir = scratch_dir("writer_symlink");
    fs::create_dir(dir.join("blobs")).unwrap();
    let real = dir.join("blobs/real.safetensors");
    save(&real, 1).unwrap();
    fs::set_permissions(&real, fs::Permissions::from_mode(0o640)).unwrap();
    // A relative link to a relative link, as model caches lay them out.
    std::os::unix::fs::symlink("blobs/real.safetensors", dir.join("hop")).unwrap();
    std::os::unix::fs::symlink("hop", dir.join("model.safetensors")).unwrap();
    let link = dir.join("model.safetensors");
    save(&link, 2).unwrap();
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read_link(&link).unwrap(), PathBuf::from("hop"));
    assert_eq!(saved_value(&real), 2);
    assert_eq!(fs::metadata(&real).unwrap().mode() & 0o7777, 0o640);
    assert_eq!(listing(&dir.join("blobs")), ["real.safetensors"]);

    // A dangling link creates the file it names.
    std::os::unix::fs::symlink("blobs/new.safetensors", dir.join("dangling")).unwrap();
    save(&dir.join("dangling"), 3).unwrap();
    assert!(fs::symlink_metadata(dir.join("dangling"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(saved_value(&dir.join("blobs/new.safetensors")), 3);

    // A loop is an Io error, not a hang.
    std::os::unix::fs::symlink("loop_b", dir.join("loop_a")).unwrap();
    std::os::unix::fs::symlink("loop_a", dir.join("loop_b")).unwrap();
    assert_eq!(
        save(&dir.join("loop_a"), 4).unwrap_err().kind(),
        ErrorKind::Io
    );
}

#[test]
fn refuses_to_replace_directories_fifos_sockets_and_devices() {
    let dir = scratch_dir("writer_special");
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let sub = dir.join("subdir");
    fs::create_dir(&sub).unwrap();
    let sock = dir.join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let mut cases = vec![(fifo, "a FIFO"), (sub, "a directory"), (sock, "a socket")];
    if is_root() {
        // A private copy of /dev/null's device numbers, so nothing system-wide is at stake.
        let dev = dir.join("null");
        let c = std::ffi::CString::new(dev.to_str().unwrap()).unwrap();
        // SAFETY: a valid path.
        let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
        if made == 0 {
            cases.push((dev, "a device node"));
        }
    }
    for (path, what) in cases {
        let kind_before = fs::symlink_metadata(&path).unwrap().file_type();
        let err = save(&path, 1).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Io, "{what}: {err}");
        let msg = err.to_string();
        assert!(msg.contains(what) && msg.contains("refusing"), "{msg}");
        assert_eq!(
            fs::symlink_metadata(&path).unwrap().file_type(),
            kind_before
        );
    }
    let mut names = listing(&dir);
    names.retain(|n| n.starts_with('.'));
    assert!(names.is_empty(), "temporary files left: {names:?}");
}

#[test]
fn a_header_too_large_to_write_is_reported_as_such() {
    let meta: BTreeMap<String, String> =
        [("notes".to_string(), "x".repeat(MAX_HEADER_SIZE))].into();
    let data = [0u8; 2];
    let err = PreparedFile::new(
        [
            ("a", TensorView::new(Dtype::U8, &[1], &data[..1])),
            ("b", TensorView::new(Dtype::U8, &[1], &data[1..])),
        ],
        Some(&meta),
    )
    .err()
    .unwrap();
    assert_eq!(err.kind(), ErrorKind::HeaderTooLarge);
    let msg = err.to_string();
    for part in [
        "too large to write",
        "2 tensors",
        "100000005 bytes of metadata",
        "2 bytes of tensor names",
        &MAX_HEADER_SIZE.to_string(),
    ] {
        assert!(msg.contains(part), "`{part}` missing from: {msg}");
    }
    assert!(!msg.contains("corrupt"), "{msg}");
    // The bytes the header would take are named.
    let json_len = r#"{"__metadata__":{"notes":""},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#.len() + MAX_HEADER_SIZE;
    assert!(
        msg.contains(&json_len.next_multiple_of(8).to_string()),
        "{msg}"
    );
}

/// `name`'s value on `path`, or `None` where it has none.
fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid strings and a buffer of the length passed.
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}

/// Sets `name` on `path`; false where the filesystem refuses (no xattr or ACL support).
fn set_xattr(path: &Path, name: &str, value: &[u8]) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid strings and a value of the length passed.
    unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        ) == 0
    }
}

/// A POSIX ACL in the kernel's xattr form (version 2; entries of tag, permissions, id): the
/// owner rw, user 4242 r only, the owning group r, mask r, others nothing.
fn acl_with_a_named_user() -> Vec<u8> {
    let mut out = 2u32.to_le_bytes().to_vec();
    let none = u32::MAX;
    for (tag, perm, id) in [
        (0x01u16, 6u16, none), // ACL_USER_OBJ
        (0x02, 4, 4242),       // ACL_USER
        (0x04, 4, none),       // ACL_GROUP_OBJ
        (0x10, 4, none),       // ACL_MASK
        (0x20, 0, none),       // ACL_OTHER
    ] {
        out.extend(tag.to_le_bytes());
        out.extend(perm.to_le_bytes());
        out.extend(id.to_le_bytes());
    }
    out
}

#[test]
fn keeps_an_existing_files_acl_and_extended_attributes() {
    let dir = scratch_dir("writer_xattrs");
    let path = dir.join("x.safetensors");
    save(&path, 1).unwrap();
    if !set_xattr(&path, "user.origin", b"trained-by-us") {
        eprintln!("skipped: this filesystem has no user extended attributes");
        return;
    }
    let acl = acl_with_a_named_user();
    let has_acl = set_xattr(&path, "system.posix_acl_access", &acl);
    save(&path, 2).unwrap();
    assert_eq!(saved_value(&path), 2);
    assert_eq!(
        xattr(&path, "user.origin").as_deref(),
        Some(&b"trained-by-us"[..])
    );
    if has_acl {
        assert_eq!(
            xattr(&path, "system.posix_acl_access"),
            Some(acl),
            "the ACL of the replaced file"
        );
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o640);
    } else {
        eprintln!("ACL part skipped: this filesystem refuses POSIX ACLs");
    }
    // A new file has none.
    let fresh = dir.join("fresh.safetensors");
    save(&fresh, 3).unwrap();
    assert_eq!(xattr(&fresh, "user.origin"), None);
}
