//! `tessera local`'s remote-write flags, mapped onto the ingester's `[sink]` table:
//!
//! | flag | `[sink]` key |
//! |---|---|
//! | `--remote-write URL` | `kind = "remote_write"`, `url` |
//! | `--remote-write-ca-file FILE` | `tls.ca_file` (https only) |
//! | `--remote-write-basic-auth USER:PASSWORD_FILE` | `basic_auth.username`, `basic_auth.password_file` |
//! | `--remote-write-bearer-token-file FILE` | `bearer_token_file` |
//! | `--remote-write-header NAME=VALUE` (repeatable) | `headers.NAME = "VALUE"` |
//!
//! The table is built here and then read and checked by the ingester exactly as its
//! configuration file would be ([`ingester_sink`]), so that a flag that cannot work is
//! refused before anything starts, named, with exit code 64. Passwords and tokens stay
//! in their files: never on the command line, where `ps` would show them.
//!
//! ```text
//! tessera local --remote-write https://mimir.example/api/v1/push \
//!     --remote-write-ca-file ca.pem --remote-write-basic-auth tenant-1:/run/secrets/mimir \
//!     --remote-write-header X-Scope-OrgID=team-a
//! ```

use std::path::{Path, PathBuf};

use tessera_runtime::config::InvalidSetting;
use toml::{Table, Value};

/// Where the pipeline writes, and how it authenticates to a remote-write store.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RemoteWriteFlags {
    /// Send to a Prometheus remote-write endpoint instead of the file sink
    /// (e.g. http://127.0.0.1:9090/api/v1/write, or an https:// URL).
    #[arg(long = "remote-write", value_name = "URL")]
    pub url: Option<String>,
    /// With an https:// --remote-write URL: the CA certificates (PEM) to trust instead of
    /// the system's roots.
    #[arg(long = "remote-write-ca-file", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Basic auth for --remote-write: the user name, and a file holding the password
    /// (a trailing newline is ignored).
    #[arg(long = "remote-write-basic-auth", value_name = "USER:PASSWORD_FILE")]
    pub basic_auth: Option<String>,
    /// A file holding a bearer token for --remote-write (`Authorization: Bearer`), re-read
    /// when it changes.
    #[arg(long = "remote-write-bearer-token-file", value_name = "FILE")]
    pub bearer_token_file: Option<PathBuf>,
    /// A header sent with every remote-write request, e.g. X-Scope-OrgID=team-a
    /// (repeatable).
    #[arg(long = "remote-write-header", value_name = "NAME=VALUE")]
    pub headers: Vec<String>,
}

/// Why the remote-write flags cannot be used (exit code 64).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// A remote-write setting without the URL it is for.
    #[error("{0} needs --remote-write URL")]
    NeedsRemoteWrite(&'static str),
    /// Not `USER:PASSWORD_FILE`.
    #[error("--remote-write-basic-auth `{0}`: expected USER:PASSWORD_FILE (a user name, `:`, then a file)")]
    BasicAuth(String),
    /// Not `NAME=VALUE`.
    #[error("--remote-write-header `{0}`: expected NAME=VALUE")]
    Header(String),
    /// The same header twice.
    #[error("--remote-write-header `{0}` is given more than once")]
    DuplicateHeader(String),
    /// Two ways of authenticating.
    #[error("--remote-write-basic-auth and --remote-write-bearer-token-file cannot be used together")]
    TwoCredentials,
    /// A CA file for a URL that does not use TLS.
    #[error("--remote-write-ca-file needs an https:// --remote-write URL, not `{0}`")]
    CaFileWithoutHttps(String),
    /// A path that TOML cannot carry.
    #[error("{flag} `{}`: the path is not UTF-8", path.display())]
    NotUtf8 {
        /// The flag.
        flag: &'static str,
        /// Its path.
        path: PathBuf,
    },
    /// The ingester refused the settings: a file that cannot be read, a header name that
    /// is not one, a URL that cannot be used, ...
    #[error("{flag}: {reason}")]
    Refused {
        /// The flag at fault.
        flag: &'static str,
        /// The ingester's reason.
        reason: String,
    },
}

impl RemoteWriteFlags {
    /// The first remote-write setting given, by its flag.
    fn first_setting(&self) -> Option<&'static str> {
        [
            (self.ca_file.is_some(), "--remote-write-ca-file"),
            (self.basic_auth.is_some(), "--remote-write-basic-auth"),
            (self.bearer_token_file.is_some(), "--remote-write-bearer-token-file"),
            (!self.headers.is_empty(), "--remote-write-header"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    /// The ingester's `[sink]` table for these flags; `None` without `--remote-write`
    /// (the file sink).
    ///
    /// # Errors
    ///
    /// A setting without `--remote-write`, a value that does not parse, a header given
    /// twice, both basic auth and a bearer token, a CA file for an `http` URL.
    pub fn sink_table(&self) -> Result<Option<Table>, FlagError> {
        let Some(url) = &self.url else {
            return match self.first_setting() {
                Some(flag) => Err(FlagError::NeedsRemoteWrite(flag)),
                None => Ok(None),
            };
        };
        let mut sink = Table::new();
        sink.insert("kind".into(), "remote_write".into());
        sink.insert("url".into(), url.as_str().into());
        if let Some(ca_file) = &self.ca_file {
            let https = url.get(..8).is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"));
            if !https {
                return Err(FlagError::CaFileWithoutHttps(url.clone()));
            }
            let mut tls = Table::new();
            tls.insert("ca_file".into(), path_value("--remote-write-ca-file", ca_file)?);
            sink.insert("tls".into(), Value::Table(tls));
        }
        match (&self.basic_auth, &self.bearer_token_file) {
            (Some(_), Some(_)) => return Err(FlagError::TwoCredentials),
            (Some(text), None) => {
                let (username, password_file) = parse_basic_auth(text)?;
                let mut basic_auth = Table::new();
                basic_auth.insert("username".into(), username.into());
                basic_auth.insert("password_file".into(), path_value("--remote-write-basic-auth", password_file)?);
                sink.insert("basic_auth".into(), Value::Table(basic_auth));
            }
            (None, Some(path)) => {
                sink.insert("bearer_token_file".into(), path_value("--remote-write-bearer-token-file", path)?);
            }
            (None, None) => {}
        }
        if !self.headers.is_empty() {
            let mut headers = Table::new();
            for text in &self.headers {
                let (name, value) = parse_header(text)?;
                if headers.keys().any(|known| known.eq_ignore_ascii_case(name)) {
                    return Err(FlagError::DuplicateHeader(name.to_owned()));
                }
                headers.insert(name.to_owned(), value.into());
            }
            sink.insert("headers".into(), Value::Table(headers));
        }
        Ok(Some(sink))
    }
}

/// `USER:PASSWORD_FILE`, split at the first `:` (a basic-auth user name holds none; the
/// file's path may).
pub fn parse_basic_auth(text: &str) -> Result<(&str, &Path), FlagError> {
    match text.split_once(':') {
        Some((user, file)) if !user.is_empty() && !file.is_empty() => Ok((user, Path::new(file))),
        _ => Err(FlagError::BasicAuth(text.to_owned())),
    }
}

/// `NAME=VALUE`, split at the first `=`; the value may be empty, the name may not.
pub fn parse_header(text: &str) -> Result<(&str, &str), FlagError> {
    match text.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => Ok((name.trim(), value)),
        _ => Err(FlagError::Header(text.to_owned())),
    }
}

fn path_value(flag: &'static str, path: &Path) -> Result<Value, FlagError> {
    let text = path.to_str().ok_or_else(|| FlagError::NotUtf8 { flag, path: path.to_owned() })?;
    Ok(text.into())
}

/// The flag that set the ingester's key `key` (`sink.basic_auth.username`, ...).
fn flag_of(key: &str) -> &'static str {
    let field = key.strip_prefix("sink.").unwrap_or(key);
    let flags = [
        ("tls", "--remote-write-ca-file"),
        ("basic_auth", "--remote-write-basic-auth"),
        ("bearer_token_file", "--remote-write-bearer-token-file"),
        ("headers", "--remote-write-header"),
    ];
    flags.into_iter().find(|(prefix, _)| field.starts_with(prefix)).map_or("--remote-write", |(_, flag)| flag)
}

/// Reads `sink` as the ingester reads its `[sink]` and checks it as the ingester does at
/// start (files read, header names parsed), naming the flag at fault.
///
/// # Errors
///
/// [`FlagError::Refused`], with the ingester's reason.
pub fn ingester_sink(config: &mut tessera_ingester::Config, sink: Table) -> Result<(), FlagError> {
    config.sink = sink
        .try_into()
        .map_err(|error: toml::de::Error| FlagError::Refused { flag: "--remote-write", reason: error.to_string() })?;
    config.validate().map_err(|InvalidSetting { key, reason }| FlagError::Refused { flag: flag_of(&key), reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(url: Option<&str>) -> RemoteWriteFlags {
        RemoteWriteFlags { url: url.map(str::to_owned), ..RemoteWriteFlags::default() }
    }

    #[test]
    fn basic_auth_and_headers_parse_at_their_first_separator() {
        let cases: [(&str, Option<(&str, &str)>); 6] = [
            ("alice:/run/secrets/pw", Some(("alice", "/run/secrets/pw"))),
            ("alice:C:/pw:2", Some(("alice", "C:/pw:2"))),
            ("alice", None),
            (":/run/pw", None),
            ("alice:", None),
            ("", None),
        ];
        for (text, expected) in cases {
            let parsed = parse_basic_auth(text).map(|(user, file)| (user, file.to_str().unwrap()));
            assert_eq!(parsed.ok(), expected, "{text}");
        }
        assert_eq!(parse_header("X-Scope-OrgID=team-a"), Ok(("X-Scope-OrgID", "team-a")));
        assert_eq!(parse_header("X-Query=a=b"), Ok(("X-Query", "a=b")));
        assert_eq!(parse_header("X-Empty="), Ok(("X-Empty", "")));
        assert_eq!(parse_header("X-Scope-OrgID"), Err(FlagError::Header("X-Scope-OrgID".into())));
        assert_eq!(parse_header("=team-a"), Err(FlagError::Header("=team-a".into())));
        assert_eq!(
            FlagError::BasicAuth("alice".into()).to_string(),
            "--remote-write-basic-auth `alice`: expected USER:PASSWORD_FILE (a user name, `:`, then a file)"
        );
    }

    #[test]
    fn every_flag_maps_onto_its_sink_key() {
        let all = RemoteWriteFlags {
            url: Some("https://store.example/api/v1/push".into()),
            ca_file: Some("/etc/tessera/ca.pem".into()),
            basic_auth: Some("tenant-1:/run/secrets/pw".into()),
            bearer_token_file: None,
            headers: vec!["X-Scope-OrgID=team-a".into(), "X-Extra=1".into()],
        };
        let expected: Table = toml::from_str(
            r#"
            kind = "remote_write"
            url = "https://store.example/api/v1/push"
            tls = { ca_file = "/etc/tessera/ca.pem" }
            basic_auth = { username = "tenant-1", password_file = "/run/secrets/pw" }
            headers = { "X-Scope-OrgID" = "team-a", "X-Extra" = "1" }
            "#,
        )
        .unwrap();
        assert_eq!(all.sink_table(), Ok(Some(expected)));

        let token = RemoteWriteFlags { bearer_token_file: Some("/run/token".into()), ..flags(Some("http://h/w")) };
        let expected: Table =
            toml::from_str("kind = \"remote_write\"\nurl = \"http://h/w\"\nbearer_token_file = \"/run/token\"\n")
                .unwrap();
        assert_eq!(token.sink_table(), Ok(Some(expected)));
        assert_eq!(flags(None).sink_table(), Ok(None), "the file sink");
    }

    #[test]
    fn flags_that_cannot_work_are_refused_by_name() {
        let without_url = [
            RemoteWriteFlags { ca_file: Some("ca.pem".into()), ..flags(None) },
            RemoteWriteFlags { basic_auth: Some("u:f".into()), ..flags(None) },
            RemoteWriteFlags { bearer_token_file: Some("t".into()), ..flags(None) },
            RemoteWriteFlags { headers: vec!["A=b".into()], ..flags(None) },
        ];
        let expected = [
            "--remote-write-ca-file",
            "--remote-write-basic-auth",
            "--remote-write-bearer-token-file",
            "--remote-write-header",
        ];
        for (flags, flag) in without_url.into_iter().zip(expected) {
            assert_eq!(flags.sink_table(), Err(FlagError::NeedsRemoteWrite(flag)));
        }
        let http = "http://127.0.0.1:9090/api/v1/write";
        let url = Some(http);
        let cases = [
            (RemoteWriteFlags { basic_auth: Some("alice".into()), ..flags(url) }, FlagError::BasicAuth("alice".into())),
            (RemoteWriteFlags { headers: vec!["A".into()], ..flags(url) }, FlagError::Header("A".into())),
            (
                RemoteWriteFlags { headers: vec!["A=1".into(), "a=2".into()], ..flags(url) },
                FlagError::DuplicateHeader("a".into()),
            ),
            (
                RemoteWriteFlags { basic_auth: Some("u:f".into()), bearer_token_file: Some("t".into()), ..flags(url) },
                FlagError::TwoCredentials,
            ),
            (
                RemoteWriteFlags { ca_file: Some("ca.pem".into()), ..flags(url) },
                FlagError::CaFileWithoutHttps(http.into()),
            ),
        ];
        for (flags, error) in cases {
            assert_eq!(flags.sink_table(), Err(error), "{flags:?}");
        }
    }

    fn ingester_with(flags: &RemoteWriteFlags) -> Result<tessera_ingester::Config, FlagError> {
        let mut config: tessera_ingester::Config = toml::from_str("").unwrap();
        ingester_sink(&mut config, flags.sink_table()?.expect("--remote-write given"))?;
        Ok(config)
    }

    #[test]
    fn the_ingester_reads_the_table_and_refuses_what_cannot_work_naming_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let (password, token) = (dir.path().join("password"), dir.path().join("token"));
        std::fs::write(&password, "secret\n").unwrap();
        std::fs::write(&token, "abc").unwrap();
        let url = Some("http://127.0.0.1:9090/api/v1/write");
        let basic = RemoteWriteFlags {
            basic_auth: Some(format!("alice:{}", password.display())),
            headers: vec!["X-Scope-OrgID=team-a".into()],
            ..flags(url)
        };
        let config = ingester_with(&basic).unwrap();
        let sink = format!("{:?}", config.sink);
        assert!(sink.contains("username: \"alice\""), "{sink}");
        assert!(sink.contains(&format!("password_file: Some({:?})", password)), "{sink}");
        assert!(sink.contains("\"X-Scope-OrgID\": \"team-a\""), "{sink}");
        assert!(!sink.contains("secret"), "the password stays in its file: {sink}");
        let bearer = RemoteWriteFlags { bearer_token_file: Some(token.clone()), ..flags(url) };
        let sink = format!("{:?}", ingester_with(&bearer).unwrap().sink);
        assert!(sink.contains(&format!("bearer_token_file: Some({token:?})")), "{sink}");

        let missing = dir.path().join("missing");
        let refusals = [
            (
                RemoteWriteFlags { basic_auth: Some(format!("alice:{}", missing.display())), ..flags(url) },
                "--remote-write-basic-auth",
            ),
            (
                RemoteWriteFlags { bearer_token_file: Some(missing.clone()), ..flags(url) },
                "--remote-write-bearer-token-file",
            ),
            (
                RemoteWriteFlags {
                    ca_file: Some(missing.clone()),
                    ..flags(Some("https://127.0.0.1:9090/api/v1/write"))
                },
                "--remote-write-ca-file",
            ),
            (RemoteWriteFlags { headers: vec!["Bad Name=1".into()], ..flags(url) }, "--remote-write-header"),
            (flags(Some("ftp://127.0.0.1/write")), "--remote-write"),
        ];
        for (flags, flag) in refusals {
            let error = ingester_with(&flags).unwrap_err();
            assert!(matches!(&error, FlagError::Refused { flag: at, .. } if *at == flag), "{flags:?}: {error}");
        }
        let error = ingester_with(&RemoteWriteFlags { bearer_token_file: Some(missing.clone()), ..flags(url) });
        assert!(error.unwrap_err().to_string().contains(&missing.display().to_string()), "the file is named");
    }
}
