//! `credential_process` of an AWS profile: a command the user's config names that prints
//! temporary credentials as JSON (`{"Version": 1, "AccessKeyId": ..., "SecretAccessKey": ...,
//! "SessionToken": ..., "Expiration": "2026-11-30T12:00:00Z"}`), as the AWS CLI and SDKs run
//! it (`sh -c`, stdin closed, stderr the caller's, so that the tool's own messages reach the
//! user). object_store has no such provider; this is one.
//!
//! Bounded on every side: the command gets the request timeout to finish (then it is killed),
//! at most 64 KiB of its output is read, and its credentials are kept until fewer than five
//! minutes of them remain (the rule object_store applies to every temporary credential), then
//! fetched again, at most every 100 ms. What it prints is registered as secret before anything
//! else happens; no message shows the command (it may carry a token) or its output.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use object_store::aws::AwsCredential;
use object_store::CredentialProvider;

use crate::secrets;

/// Output read from the command, at most.
const MAX_OUTPUT: u64 = 64 << 10;
/// Credentials with less than this left are fetched again.
const MIN_TTL: Duration = Duration::from_secs(300);
/// Not fetched again sooner than this after the last fetch while still valid.
const FETCH_BACKOFF: Duration = Duration::from_millis(100);

/// A profile's `credential_process`, run when credentials are needed.
#[derive(Debug)]
pub(crate) struct ProcessCredentials {
    command: String,
    deadline: Duration,
    cached: Mutex<Option<Cached>>,
}

#[derive(Debug, Clone)]
struct Cached {
    credential: Arc<AwsCredential>,
    /// When they expire (`None`: never, as the format allows).
    expires: Option<SystemTime>,
    fetched: Instant,
}

impl ProcessCredentials {
    /// The command `command`, given `deadline` to print its credentials.
    pub(crate) fn new(command: String, deadline: Duration) -> ProcessCredentials {
        ProcessCredentials {
            command,
            deadline,
            cached: Mutex::new(None),
        }
    }

    fn fresh(&self) -> Option<Arc<AwsCredential>> {
        let cached = self.cached.lock().ok()?.clone()?;
        let now = SystemTime::now();
        let left = match cached.expires {
            None => return Some(cached.credential),
            Some(at) => at.duration_since(now).ok()?,
        };
        (left > MIN_TTL || cached.fetched.elapsed() < FETCH_BACKOFF).then_some(cached.credential)
    }
}

#[async_trait::async_trait]
impl CredentialProvider for ProcessCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        if let Some(credential) = self.fresh() {
            return Ok(credential);
        }
        let (command, deadline) = (self.command.clone(), self.deadline);
        let got = tokio::task::spawn_blocking(move || run(&command, deadline))
            .await
            .map_err(|e| failed(format!("its runner stopped ({e})")))?
            .map_err(failed)?;
        let credential = Arc::new(got.0);
        if let Ok(mut cached) = self.cached.lock() {
            *cached = Some(Cached {
                credential: Arc::clone(&credential),
                expires: got.1,
                fetched: Instant::now(),
            });
        }
        Ok(credential)
    }
}

fn failed(why: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: format!("the AWS profile's credential_process {why}").into(),
    }
}

/// Runs `command` and reads its credentials, or says why there are none (never quoting it).
fn run(command: &str, deadline: Duration) -> Result<(AwsCredential, Option<SystemTime>), String> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("could not be started ({e})"))?;
    let stdout = child.stdout.take().ok_or("could not be read")?;
    // Read on a thread of its own, so that a command that never closes its output (or leaves a
    // child holding it) cannot hold this call past the deadline.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let read = stdout.take(MAX_OUTPUT).read_to_end(&mut out).map(|_| out);
        let _ = tx.send(read);
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "did not finish within {} ms and was stopped",
                    deadline.as_millis()
                ));
            }
        }
    };
    if !status.success() {
        return Err(format!("failed ({status})"));
    }
    let left = deadline
        .saturating_sub(start.elapsed())
        .max(Duration::from_millis(100));
    let out = match rx.recv_timeout(left) {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("could not be read ({e})")),
        Err(_) => return Err("left its output open past the deadline".into()),
    };
    parse(&out)
}

/// The credentials of the process's output, registered as secrets first.
fn parse(out: &[u8]) -> Result<(AwsCredential, Option<SystemTime>), String> {
    let value: serde_json::Value = serde_json::from_slice(out)
        .map_err(|_| "printed no JSON object (see the AWS CLI's credential_process format)")?;
    let text = |key: &str| value.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    for key in ["AccessKeyId", "SecretAccessKey", "SessionToken"] {
        if let Some(secret) = text(key) {
            secrets::register(&secret);
        }
    }
    if value.get("Version").and_then(|v| v.as_u64()) != Some(1) {
        return Err("printed no \"Version\": 1 (the only version of the format)".into());
    }
    let (Some(key_id), Some(secret_key)) = (text("AccessKeyId"), text("SecretAccessKey")) else {
        return Err("printed no AccessKeyId and SecretAccessKey".into());
    };
    let expires = match text("Expiration") {
        None => None,
        Some(at) => Some(rfc3339(&at).ok_or("printed an Expiration that is not an RFC 3339 time")?),
    };
    Ok((
        AwsCredential {
            key_id,
            secret_key,
            token: text("SessionToken"),
        },
        expires,
    ))
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` as a time.
fn rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && rest.as_bytes()[3] == b':' => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (oh, om) = (
                rest[1..3].parse::<i64>().ok()?,
                rest[4..6].parse::<i64>().ok()?,
            );
            sign * (oh * 3600 + om * 60)
        }
        _ => return None,
    };
    // Days from 1970-01-01 to the civil date (the proleptic Gregorian calendar).
    let (y2, m2) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset;
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_with_offsets_and_fractions() {
        let at = |s| rfc3339(s).map(|t| t.duration_since(UNIX_EPOCH).unwrap().as_secs());
        assert_eq!(at("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(at("2026-11-30T02:00:00Z"), Some(1_796_004_000));
        assert_eq!(at("2026-11-30T03:00:00.123+01:00"), Some(1_796_004_000));
        assert_eq!(at("2000-02-29T00:00:00Z"), Some(951_782_400));
        for bad in [
            "2026-11-30",
            "2026-13-01T00:00:00Z",
            "2026-11-30T02:00:00",
            "2026-11-30T02:00:00+0100",
            "2026-11-30T02:00:00.Z",
            "1969-12-31T23:59:59Z",
            "2026-11-30T0a:00:00Z",
        ] {
            assert_eq!(at(bad), None, "{bad}");
        }
    }

    #[test]
    fn output_is_the_documented_format_and_its_secrets_are_registered() {
        let (c, at) = parse(
            br#"{"Version": 1, "AccessKeyId": "AKIDPROC", "SecretAccessKey": "proc-secret-8812",
                "SessionToken": "proc-token-4471", "Expiration": "2030-01-01T00:00:00Z"}"#,
        )
        .unwrap();
        assert_eq!(
            (c.key_id.as_str(), c.secret_key.as_str()),
            ("AKIDPROC", "proc-secret-8812")
        );
        assert_eq!(c.token.as_deref(), Some("proc-token-4471"));
        assert!(at.is_some());
        assert!(!secrets::scrub("x proc-secret-8812 proc-token-4471", 100).contains("proc-"));
        let (c, at) =
            parse(br#"{"Version": 1, "AccessKeyId": "A", "SecretAccessKey": "S"}"#).unwrap();
        assert!(c.token.is_none() && at.is_none(), "no expiry: kept");
        for bad in [
            &br#"{"Version": 2, "AccessKeyId": "A", "SecretAccessKey": "S"}"#[..],
            br#"{"Version": 1, "AccessKeyId": "A"}"#,
            br#"{"Version": 1, "AccessKeyId": "A", "SecretAccessKey": "S", "Expiration": "soon"}"#,
            b"not json",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(!e.contains('{'), "{e}");
        }
    }

    #[test]
    fn a_command_that_fails_or_hangs_is_an_error_within_the_deadline() {
        let e = run("exit 3", Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("failed"), "{e}");
        let start = Instant::now();
        let e = run("sleep 30", Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("did not finish"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(10));
        // Exits, but leaves a child holding its output open.
        let e = run(
            r#"(sleep 30 &) ; printf '{"Version": 1,'"#,
            Duration::from_millis(500),
        )
        .unwrap_err();
        assert!(
            e.contains("left its output open") || e.contains("no JSON"),
            "{e}"
        );
        let (c, _) = run(
            r#"printf '{"Version": 1, "AccessKeyId": "A1", "SecretAccessKey": "S1-secret"}'"#,
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(c.key_id, "A1");
    }
}
