//! The AWS shared files, for `s3://` URLs when the environment names no keys: credentials from
//! `~/.aws/credentials` (or `$AWS_SHARED_CREDENTIALS_FILE`), region and endpoint from
//! `~/.aws/config` (or `$AWS_CONFIG_FILE`), in the profile `$AWS_PROFILE` names (else
//! `default`), as the AWS CLI reads them: `[name]` sections in the credentials file,
//! `[profile name]` in the config file (for the default profile `[default]` or
//! `[profile default]`), `key = value` lines, `#` and `;`
//! comments. Only what is needed is read (`aws_access_key_id`, `aws_secret_access_key`,
//! `aws_session_token`, `region`, `endpoint_url`, `credential_process`); a file that is missing, unreadable or larger
//! than 1 MiB is as if absent (credentials then come from the instance, as without files).
//! Nothing read here ever appears in a message.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What the shared files give for one profile.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Profile {
    pub(crate) access_key_id: Option<String>,
    pub(crate) secret_access_key: Option<String>,
    pub(crate) session_token: Option<String>,
    pub(crate) region: Option<String>,
    pub(crate) endpoint_url: Option<String>,
    /// A command printing temporary credentials (`credential_process`).
    pub(crate) credential_process: Option<String>,
}

/// Files larger than this are not read.
const MAX_FILE: u64 = 1 << 20;

/// The profile the environment names, from the files the environment (or the home directory)
/// names.
pub(crate) fn from_files() -> Profile {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let name = var("AWS_PROFILE").unwrap_or_else(|| "default".to_owned());
    let home = var("HOME").map(PathBuf::from);
    let file = |env: &str, default: &str| {
        var(env)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(default)))
    };
    let credentials = file("AWS_SHARED_CREDENTIALS_FILE", "credentials")
        .and_then(|p| read_small(&p))
        .map(|text| section(&text, &name))
        .unwrap_or_default();
    let config = file("AWS_CONFIG_FILE", "config")
        .and_then(|p| read_small(&p))
        .map(|text| config_profile(&text, &name))
        .unwrap_or_default();
    let get = |map: &BTreeMap<String, String>, key: &str| map.get(key).cloned();
    Profile {
        access_key_id: get(&credentials, "aws_access_key_id")
            .or_else(|| get(&config, "aws_access_key_id")),
        secret_access_key: get(&credentials, "aws_secret_access_key")
            .or_else(|| get(&config, "aws_secret_access_key")),
        session_token: get(&credentials, "aws_session_token")
            .or_else(|| get(&config, "aws_session_token")),
        region: get(&config, "region").or_else(|| get(&credentials, "region")),
        endpoint_url: get(&config, "endpoint_url"),
        credential_process: get(&config, "credential_process")
            .or_else(|| get(&credentials, "credential_process")),
    }
}

/// Profile `name` of a config file: `[profile name]`; for `default`, `[default]` and
/// `[profile default]` both (the AWS CLI accepts either), a key in `[profile default]` winning
/// over the same key in `[default]` (the longer form is the explicit one).
fn config_profile(text: &str, name: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if name == "default" {
        out = section(text, "default");
    }
    out.extend(section(text, &format!("profile {name}")));
    out
}

fn read_small(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_FILE {
        return None;
    }
    std::fs::read_to_string(path).ok()
}

/// The `key = value` lines of section `[name]` of an INI text (the last of repeated keys wins;
/// keys compared without case, as the AWS CLI does; section names with their inner spaces
/// collapsed).
pub(crate) fn section(text: &str, name: &str) -> BTreeMap<String, String> {
    let want = collapse(name);
    let mut out = BTreeMap::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            inside = rest
                .strip_suffix(']')
                .is_some_and(|s| collapse(s.trim()) == want);
            continue;
        }
        if !inside {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            let value = value.trim();
            if !value.is_empty() {
                out.insert(key.trim().to_ascii_lowercase(), value.to_owned());
            }
        }
    }
    out
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::{config_profile, section};

    #[test]
    fn the_default_profile_may_be_spelt_either_way_in_the_config_file() {
        let long = "[profile default]\nendpoint_url = http://127.0.0.1:9000\nregion = r1\n";
        let p = config_profile(long, "default");
        assert_eq!(
            p.get("endpoint_url").map(String::as_str),
            Some("http://127.0.0.1:9000")
        );
        let both = "[default]\nregion = short\noutput = json\n[profile default]\nregion = long\n";
        let p = config_profile(both, "default");
        assert_eq!(p.get("region").map(String::as_str), Some("long"));
        assert_eq!(p.get("output").map(String::as_str), Some("json"));
        // `[default]` is not `[profile work]`'s, nor the reverse.
        let p = config_profile("[default]\nregion = d\n", "work");
        assert!(p.is_empty());
    }

    #[test]
    fn reads_the_named_section_only() {
        let text = "# comment\n[default]\naws_access_key_id = A\naws_secret_access_key=S\n\n\
                    [other]\naws_access_key_id = B\n; note\n[profile  work]\nRegion = eu-west-1\n\
                    endpoint_url = http://127.0.0.1:9000\nempty =\n";
        let d = section(text, "default");
        assert_eq!(d.get("aws_access_key_id").map(String::as_str), Some("A"));
        assert_eq!(
            d.get("aws_secret_access_key").map(String::as_str),
            Some("S")
        );
        assert_eq!(d.len(), 2);
        let w = section(text, "profile work");
        assert_eq!(w.get("region").map(String::as_str), Some("eu-west-1"));
        assert_eq!(
            w.get("endpoint_url").map(String::as_str),
            Some("http://127.0.0.1:9000")
        );
        assert!(!w.contains_key("empty"));
        assert!(section(text, "absent").is_empty());
        assert!(section("[default\naws_access_key_id = X\n", "default").is_empty());
    }
}
