//! `logging::init` installs the global subscriber once (its own test binary: it is global).

use tessera_runtime::{LogFormat, logging};

#[test]
fn init_installs_once() {
    logging::init(LogFormat::Json, "info").expect("first init installs the subscriber");
    tracing::info!(answer = 42, "logged as json to stderr");
    let error = logging::init(LogFormat::Text, "info").expect_err("second init is refused");
    assert!(matches!(error, logging::LoggingError::AlreadyInitialised), "{error:?}");
}
