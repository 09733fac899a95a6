//! Loading config files: defaults, a good file, an unknown key, a missing file.

use std::io::Write;

use tessera_runtime::config::{ConfigError, load_toml};

#[derive(Debug, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    flush_interval_secs: u64,
    listen_address: String,
    sink: Sink,
}

#[derive(Debug, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Sink {
    max_batch_samples: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self { flush_interval_secs: 10, listen_address: "127.0.0.1:8125".to_owned(), sink: Sink::default() }
    }
}

impl Default for Sink {
    fn default() -> Self {
        Self { max_batch_samples: 1000 }
    }
}

fn file_with(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(text.as_bytes()).expect("write temp file");
    file
}

#[test]
fn no_file_gives_the_serde_defaults() {
    let config: Config = load_toml(None).expect("defaults");
    assert_eq!(config, Config::default());
}

#[test]
fn a_good_file_overrides_only_what_it_sets() {
    let file = file_with("flush_interval_secs = 1\n\n[sink]\nmax_batch_samples = 50\n");
    let config: Config = load_toml(Some(file.path())).expect("valid file");
    assert_eq!(
        config,
        Config {
            flush_interval_secs: 1,
            listen_address: "127.0.0.1:8125".to_owned(),
            sink: Sink { max_batch_samples: 50 }
        }
    );
}

#[test]
fn an_unknown_key_is_rejected_naming_the_key_the_line_and_the_file() {
    let file = file_with("flush_interval_secs = 1\n\n[sink]\nmax_batch_sample = 50\n");
    let error = load_toml::<Config>(Some(file.path())).expect_err("unknown key");
    assert!(matches!(error, ConfigError::Parse { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("max_batch_sample"), "{message}");
    assert!(message.contains("line 4"), "{message}");
    assert!(message.contains(&file.path().display().to_string()), "{message}");
}

#[test]
fn a_wrong_type_is_rejected() {
    let file = file_with("flush_interval_secs = \"ten\"\n");
    let message = load_toml::<Config>(Some(file.path())).expect_err("wrong type").to_string();
    assert!(message.contains("flush_interval_secs") || message.contains("line 1"), "{message}");
}

#[test]
fn a_missing_file_is_named() {
    let directory = tempfile::tempdir().expect("temp dir");
    let path = directory.path().join("absent.toml");
    let error = load_toml::<Config>(Some(&path)).expect_err("missing file");
    assert!(matches!(error, ConfigError::Read { .. }), "{error:?}");
    assert!(error.to_string().contains(&path.display().to_string()), "{error}");
}

#[test]
fn a_type_without_defaults_is_a_defaults_error() {
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Strict {
        required_secs: u64,
    }
    let error = load_toml::<Strict>(None).expect_err("no defaults");
    assert!(matches!(error, ConfigError::Defaults { .. }), "{error:?}");
}

#[test]
fn telemetry_defaults_to_its_port_and_takes_an_address_or_refuses_unknown_keys() {
    use std::net::SocketAddr;
    use tessera_runtime::config::TelemetryConfig;

    #[derive(Debug, Default, serde::Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Daemon {
        telemetry: TelemetryConfig<9199>,
    }
    let parse = |text: &str| toml::from_str::<Daemon>(text);
    let default = Some(SocketAddr::from(([127, 0, 0, 1], 9199)));
    assert_eq!(parse("").unwrap().telemetry.listen, default);
    assert_eq!(parse("[telemetry]").unwrap().telemetry.listen, default);
    let set = parse("[telemetry]\nlisten = \"0.0.0.0:9000\"").unwrap();
    assert_eq!(set.telemetry.listen, Some(SocketAddr::from(([0, 0, 0, 0], 9000))));
    let error = parse("[telemetry]\nlisen = \"0.0.0.0:9000\"").unwrap_err().to_string();
    assert!(error.contains("lisen"), "{error}");
}

#[test]
fn profiling_is_on_unless_the_telemetry_table_turns_it_off() {
    use tessera_runtime::config::TelemetryConfig;

    #[derive(Debug, Default, serde::Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Daemon {
        telemetry: TelemetryConfig<9199>,
    }
    let parse = |text: &str| toml::from_str::<Daemon>(text).unwrap().telemetry.profiling;
    assert!(parse(""));
    assert!(parse("[telemetry]\nlisten = \"0.0.0.0:9000\""));
    assert!(!parse("[telemetry]\nprofiling = false"));
    assert!(toml::from_str::<Daemon>("[telemetry]\nprofiling = \"no\"").is_err());
}
