//! Broken answers through the fault proxy (short, long and endless bodies, wrong ranges, a
//! whole object for a range, error pages, changed and weak ETags, failures, redirect loops, hung
//! connections): each a typed `Io` error naming the URL, at once or at the deadline.

use super::*;

/// Opens the sample through the proxy spoiling every GET after the first `after` with `fault`,
/// and returns the error's text (which must be an `Io` error naming the proxy's URL).
fn fault(fault: &str, after: usize, options: RemoteOptions) -> Option<String> {
    let s = serve(&format!("fault-{fault}"), &sample())?;
    let p = proxy(s.server.port, fault, after);
    let u = url(p.port, "model.safetensors");
    let e = open(&u, &options, OpenOptions::default())
        .err()
        .unwrap_or_else(|| panic!("{fault}: opened despite the fault"));
    assert_eq!(e.kind(), ErrorKind::Io, "{fault}: {e}");
    let text = e.to_string();
    assert!(text.contains(&u), "{fault}: {text}");
    Some(text)
}

/// Fails fast: one try per request, a short timeout.
pub(crate) fn impatient() -> RemoteOptions {
    RemoteOptions {
        max_retries: 0,
        request_timeout: Duration::from_secs(2),
        ..many_parts()
    }
}

#[test]
fn the_proxy_passes_a_good_answer_untouched() {
    let bytes = sample();
    let Some(s) = serve("fault-none", &bytes) else {
        return;
    };
    let p = proxy(s.server.port, "none", 0);
    let remote = open(
        &url(p.port, "model.safetensors"),
        &many_parts(),
        OpenOptions::default(),
    )
    .unwrap();
    let local = SafeFile::from_memory("local", Box::new(bytes), OpenOptions::default()).unwrap();
    same_tensors(&remote, &local);
}

#[test]
fn a_short_body_is_refused() {
    // From the third GET on: the header's two reads pass, a data part comes back short.
    let Some(text) = fault("short", 2, impatient()) else {
        return;
    };
    assert!(text.contains("body ended after"), "{text}");
}

#[test]
fn a_long_body_is_refused() {
    let Some(text) = fault("long", 2, impatient()) else {
        return;
    };
    assert!(text.contains("longer than"), "{text}");
}

#[test]
fn a_wrong_content_range_is_refused() {
    let Some(text) = fault("range", 0, impatient()) else {
        return;
    };
    assert!(text.contains("Requested"), "{text}");
}

#[test]
fn a_whole_object_instead_of_a_range_is_refused() {
    let Some(text) = fault("whole", 0, impatient()) else {
        return;
    };
    assert!(text.contains("not 206"), "{text}");
}

#[test]
fn an_html_error_page_is_refused() {
    let Some(text) = fault("html", 2, impatient()) else {
        return;
    };
    assert!(text.contains("not 206"), "{text}");
}

// A refusal whose body never ends: read only so far (1 KiB), so the error is the refusal's,
// at once, not a timeout after memory filled with it.
#[test]
fn a_refusal_with_an_endless_body_is_an_error_at_once() {
    let options = RemoteOptions {
        request_timeout: Duration::from_secs(30),
        ..impatient()
    };
    let Some(text) = fault("endless403", 0, options) else {
        return;
    };
    assert!(text.contains("403"), "{text}");
    assert!(!text.contains("timed out") && text.len() < 2000, "{text}");
}

#[test]
fn a_changed_etag_midway_is_refused() {
    let Some(text) = fault("etag", 1, impatient()) else {
        return;
    };
    assert!(text.contains("changed") && text.contains("ETag"), "{text}");
}

#[test]
fn a_server_with_weak_etags_serves_every_read() {
    // Weak tags only promise equivalent content, and `If-Match` compares strongly, so a
    // conforming server answers 412 to a GET conditional on one (the proxy does): the pin
    // falls back to the modification time and checks every answer's tag weakly.
    let bytes = sample();
    let Some(s) = serve("weak", &bytes) else {
        return;
    };
    let p = proxy(s.server.port, "weak", 0);
    let u = url(p.port, "model.safetensors");
    let local = SafeFile::from_memory("local", Box::new(bytes), OpenOptions::default()).unwrap();
    let whole = open(&u, &many_parts(), OpenOptions::default()).unwrap();
    same_tensors(&whole, &local);
    let lazy = open(&u, &on_demand(many_parts()), OpenOptions::default()).unwrap();
    same_tensors(&lazy, &local);
}

#[test]
fn a_changed_weak_etag_midway_is_refused() {
    for options in [impatient(), on_demand(impatient())] {
        let Some(s) = serve("weak-etag", &sample()) else {
            return;
        };
        let p = proxy(s.server.port, "weak-etag", 1);
        let u = url(p.port, "model.safetensors");
        let e = open(&u, &options, OpenOptions::default())
            .and_then(|f| f.tensor_bytes("big").map(|b| b.len()))
            .expect_err("a replaced object is refused");
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        let text = e.to_string();
        assert!(text.contains(&u), "{text}");
        assert!(text.contains("changed") && text.contains("ETag"), "{text}");
    }
}

#[test]
fn a_failing_server_is_retried_then_refused_with_its_status() {
    let options = RemoteOptions {
        max_retries: 1,
        ..impatient()
    };
    let Some(text) = fault("status500", 0, options) else {
        return;
    };
    assert!(text.contains("503"), "{text}");
}

#[test]
fn a_redirect_loop_is_refused() {
    let Some(text) = fault("redirect", 0, impatient()) else {
        return;
    };
    assert!(text.contains("too many redirects"), "{text}");
}

#[test]
fn a_hung_connection_ends_at_the_deadline() {
    let options = RemoteOptions {
        request_timeout: Duration::from_secs(60),
        deadline: Some(Duration::from_secs(2)),
        ..impatient()
    };
    let Some(text) = fault("hang", 2, options) else {
        return;
    };
    assert!(text.contains("deadline"), "{text}");
}

#[test]
fn a_hung_connection_ends_at_the_request_timeout() {
    let options = RemoteOptions {
        request_timeout: Duration::from_secs(1),
        ..impatient()
    };
    let Some(text) = fault("hang", 2, options) else {
        return;
    };
    assert!(text.contains("timed out"), "{text}");
}
