//! TLS for tessera, in one place: the files a client or a server is configured
//! with, the rustls configurations built from them (ring, no OpenSSL), and
//! their reload when the files change on disk. The wire links (`tessera_wire::tls`
//! re-exports this module, and tests it over real connections), remote write and the
//! telemetry port ([`crate::telemetry::web_config`]) all use it.
//!
//! ```text
//!  [forward.tls] / [ingester.tls] / [sink.tls]        [tls]
//!  ClientTlsConfig ──client_config()──▶ rustls      ServerTlsConfig ──server_config()──▶ rustls
//!    ca_file (else the system roots)                  cert_file + key_file
//!    cert_file + key_file (mTLS)                      client_ca_file (require client certs)
//!    insecure_skip_verify (tests only!)
//!                  └──────── Reloading: files checked at most once a second ────────┘
//! ```
//!
//! Every misconfiguration is an error at `--check-config` and at start (exit 64), with
//! the file named: a missing or unreadable file, a file with no certificate or no key,
//! a key that does not match its certificate, `https` with no roots to trust.
//!
//! [`Reloading`] rebuilds a configuration when one of its files changes (checked at most
//! once a second, by modification time and size): a new connection uses the new
//! certificates, established ones keep theirs. A file that changed but does not load
//! (a half-written rotation) keeps the previous configuration, logged and counted, until
//! it loads.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::file_stamp;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use serde::Deserialize;

/// How often, at most, [`Reloading`] looks at its files.
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// Why a TLS configuration cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds nothing usable.
    #[error("{what} `{}`: {reason}", path.display())]
    File {
        /// What the file should hold (`ca_file`, `cert_file`, ...).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
    /// A certificate and its key do not belong together, or rustls refused them.
    #[error("{what}: {source}")]
    Rustls {
        /// What was being built.
        what: &'static str,
        /// rustls's reason.
        source: rustls::Error,
    },
    /// No roots to verify a server against.
    #[error("no trusted roots: the system has none readable ({0}); set ca_file")]
    NoRoots(String),
    /// A setting is missing its pair.
    #[error("{0}")]
    Incomplete(&'static str),
}

/// The client side of a TLS connection: whom to trust and, for mTLS, who we are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientTlsConfig {
    /// PEM file of the CA certificates to trust; the system's roots when absent.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain to present (mutual TLS), with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Name to expect in the server's certificate, when it is not the host we connect to.
    pub server_name: Option<String>,
    /// DANGEROUS, for tests only: accept any server certificate. The connection is
    /// encrypted but not authenticated; anyone on the path can read and change it.
    pub insecure_skip_verify: bool,
}

/// The server side of a TLS listener.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerTlsConfig {
    /// PEM certificate chain of this server (required).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file` (required).
    pub key_file: Option<PathBuf>,
    /// PEM file of the CA certificates whose client certificates are accepted; when set,
    /// every client must present one (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
}

/// The one crypto provider: ring.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::File { what, path: path.to_owned(), reason: error.to_string() })
}

/// Every certificate in the PEM file at `path` (at least one).
pub fn load_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsError::File { what, path: path.to_owned(), reason: format!("bad PEM: {error}") })?;
    if certs.is_empty() {
        return Err(TlsError::File { what, path: path.to_owned(), reason: "no CERTIFICATE in it".into() });
    }
    Ok(certs)
}

/// The private key in the PEM file at `path` (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(what: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(what, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|error| TlsError::File {
        what,
        path: path.to_owned(),
        reason: format!("no private key: {error}"),
    })
}

fn roots(what: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(what, path)? {
        roots.add(cert).map_err(|source| TlsError::Rustls { what, source })?;
    }
    Ok(roots)
}

fn system_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found.errors.first().map_or_else(|| "none found".to_owned(), ToString::to_string);
        return Err(TlsError::NoRoots(why));
    }
    Ok(roots)
}

impl ClientTlsConfig {
    /// The files this configuration reads.
    pub fn files(&self) -> Vec<PathBuf> {
        [&self.ca_file, &self.cert_file, &self.key_file].into_iter().flatten().cloned().collect()
    }

    /// The rustls client configuration, its files read now.
    ///
    /// # Errors
    ///
    /// A file that cannot be read or used, a certificate without its key (or the other
    /// way round), a key that does not match its certificate, no roots to trust.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Rustls { what: "TLS versions", source })?;
        let builder = if self.insecure_skip_verify {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider())))
        } else {
            let roots = match &self.ca_file {
                Some(path) => roots("ca_file", path)?,
                None => system_roots()?,
            };
            builder.with_root_certificates(roots)
        };
        let config = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(load_certs("cert_file", cert)?, load_key("key_file", key)?)
                .map_err(|source| TlsError::Rustls { what: "cert_file and key_file", source })?,
            (None, None) => builder.with_no_client_auth(),
            _ => return Err(TlsError::Incomplete("cert_file and key_file go together")),
        };
        Ok(Arc::new(config))
    }

    /// The name to check the server's certificate against: `server_name`, else `host`.
    ///
    /// # Errors
    ///
    /// When the name is neither a DNS name nor an IP address.
    pub fn server_name(&self, host: &str) -> Result<ServerName<'static>, TlsError> {
        let name = self.server_name.as_deref().unwrap_or(host);
        ServerName::try_from(name.to_owned())
            .map_err(|_| TlsError::Incomplete("the server name is not a DNS name or an IP address"))
    }
}

impl ServerTlsConfig {
    /// The files this configuration reads.
    pub fn files(&self) -> Vec<PathBuf> {
        [&self.cert_file, &self.key_file, &self.client_ca_file].into_iter().flatten().cloned().collect()
    }

    /// The rustls server configuration, its files read now.
    ///
    /// # Errors
    ///
    /// A missing `cert_file` or `key_file`, a file that cannot be read or used, a key
    /// that does not match its certificate.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) else {
            return Err(TlsError::Incomplete("a TLS listener needs cert_file and key_file"));
        };
        let clients = match &self.client_ca_file {
            Some(path) => ClientCerts::Required(path),
            None => ClientCerts::NotAsked,
        };
        server_config(cert, key, clients, rustls::DEFAULT_VERSIONS)
    }
}

/// Which client certificates a TLS listener asks for.
#[derive(Debug, Clone, Copy)]
pub enum ClientCerts<'a> {
    /// None (anyone may connect).
    NotAsked,
    /// One signed by a CA of this PEM file, from every client (mutual TLS).
    Required(&'a Path),
    /// One signed by a CA of this file if the client presents one; clients without one
    /// are let through (exporter-toolkit's `VerifyClientCertIfGiven`).
    IfGiven(&'a Path),
}

/// A rustls server configuration: the certificate chain in `cert` with the key in `key`,
/// asking clients for `clients`, speaking `versions`.
///
/// # Errors
///
/// A file that cannot be read or used, a key that does not match its certificate.
pub fn server_config(
    cert: &Path,
    key: &Path,
    clients: ClientCerts<'_>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .map_err(|source| TlsError::Rustls { what: "TLS versions", source })?;
    let verifier = |path: &Path, optional: bool| {
        let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots("client_ca_file", path)?), provider());
        let builder = if optional { builder.allow_unauthenticated() } else { builder };
        builder.build().map_err(|error| TlsError::File {
            what: "client_ca_file",
            path: path.to_owned(),
            reason: error.to_string(),
        })
    };
    let builder = match clients {
        ClientCerts::Required(path) => builder.with_client_cert_verifier(verifier(path, false)?),
        ClientCerts::IfGiven(path) => builder.with_client_cert_verifier(verifier(path, true)?),
        ClientCerts::NotAsked => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(load_certs("cert_file", cert)?, load_key("key_file", key)?)
        .map_err(|source| TlsError::Rustls { what: "cert_file and key_file", source })?;
    Ok(Arc::new(config))
}

/// A configuration built from files, rebuilt when one of them changes (checked at most
/// once a second, by modification time and size): a new connection uses the new
/// certificates, established ones keep theirs. A file that changed but does not load (a
/// half-written rotation) keeps the previous configuration, logged and counted, until it
/// loads.
/// `E` is what a failed build says (a TLS error for certificates; the ingester's bearer
/// token file uses it too).
pub struct Reloading<T, E = TlsError> {
    files: Vec<PathBuf>,
    check_every: Duration,
    build: Box<dyn Fn() -> Result<Arc<T>, E> + Send + Sync>,
    on_error: Box<dyn Fn(&E) + Send + Sync>,
    state: Mutex<State<T>>,
}

struct State<T> {
    current: Arc<T>,
    /// The files' stamps when `current` was built.
    stamps: Vec<Stamp>,
    /// The stamps of the last change that failed to build, and when it was tried.
    failed: Option<(Vec<Stamp>, Instant)>,
    checked: Instant,
}

/// A file's [`file_stamp`].
type Stamp = Option<(SystemTime, u64)>;

/// How often a change that failed to build is tried again while the files stay as they are.
const RETRY_FAILED_EVERY: Duration = Duration::from_secs(1);

impl<T, E> std::fmt::Debug for Reloading<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading").field("files", &self.files).finish_non_exhaustive()
    }
}

impl<T, E> Reloading<T, E> {
    /// Builds the configuration now (an error here is a startup error), and again
    /// whenever one of `files` changes, looked at most once a second; `on_error` hears
    /// of every change that does not build.
    ///
    /// # Errors
    ///
    /// When the first build fails.
    pub fn new(
        files: Vec<PathBuf>,
        build: impl Fn() -> Result<Arc<T>, E> + Send + Sync + 'static,
        on_error: impl Fn(&E) + Send + Sync + 'static,
    ) -> Result<Reloading<T, E>, E> {
        Reloading::checked_every(files, RELOAD_CHECK, build, on_error)
    }

    /// [`Reloading::new`], with the files looked at most once per `check_every` (zero:
    /// at every [`Reloading::current`]).
    ///
    /// # Errors
    ///
    /// When the first build fails.
    pub fn checked_every(
        files: Vec<PathBuf>,
        check_every: Duration,
        build: impl Fn() -> Result<Arc<T>, E> + Send + Sync + 'static,
        on_error: impl Fn(&E) + Send + Sync + 'static,
    ) -> Result<Reloading<T, E>, E> {
        let stamps = files.iter().map(|path| file_stamp(path)).collect();
        let current = build()?;
        let state = Mutex::new(State { current, stamps, failed: None, checked: Instant::now() });
        Ok(Reloading { files, check_every, build: Box::new(build), on_error: Box::new(on_error), state })
    }

    /// The configuration to use now.
    pub fn current(&self) -> Arc<T> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if state.checked.elapsed() >= self.check_every {
            state.checked = Instant::now();
            let stamps: Vec<_> = self.files.iter().map(|path| file_stamp(path)).collect();
            // A change that failed is tried again at most once a second (a fix need not
            // change a file's time or size: a chmod), and counted once, not at every look.
            let retry = state
                .failed
                .as_ref()
                .is_none_or(|(failed, at)| *failed != stamps || at.elapsed() >= RETRY_FAILED_EVERY);
            if stamps != state.stamps && retry {
                match (self.build)() {
                    Ok(config) => {
                        tracing::info!(files = ?self.files, "files changed: reloaded");
                        state.current = config;
                        state.stamps = stamps;
                        state.failed = None;
                    }
                    Err(error) => {
                        if state.failed.as_ref().is_none_or(|(failed, _)| *failed != stamps) {
                            (self.on_error)(&error);
                        }
                        state.failed = Some((stamps, Instant::now()));
                    }
                }
            }
        }
        state.current.clone()
    }
}

/// Accepts any server certificate: `insecure_skip_verify`. Signatures are still checked,
/// so the handshake is sound; who the server is, is not.
#[derive(Debug)]
struct AcceptAnyServer(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Why a TLS handshake or session failed, as a short metric label: `unknown_ca`,
/// `expired`, `bad_certificate`, `no_certificate`, `name_mismatch`, or `tls` for the rest.
pub fn failure_label(error: &(dyn std::error::Error + 'static)) -> &'static str {
    tls_failure(error).unwrap_or("tls")
}

/// The [`failure_label`] of the first rustls error in `error`'s chain, or `None` when
/// the chain holds none (the failure was not TLS's).
pub fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut next = Some(error);
    while let Some(error) = next {
        // An io::Error (how tokio-rustls reports a failed handshake) hides what it wraps
        // from `source()`: look inside.
        if let Some(inner) = error.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            next = Some(inner);
            continue;
        }
        if let Some(rustls_error) = error.downcast_ref::<rustls::Error>() {
            return Some(match rustls_error {
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer) => "unknown_ca",
                rustls::Error::InvalidCertificate(rustls::CertificateError::Expired) => "expired",
                rustls::Error::InvalidCertificate(
                    rustls::CertificateError::NotValidForName | rustls::CertificateError::NotValidForNameContext { .. },
                ) => "name_mismatch",
                rustls::Error::NoCertificatesPresented => "no_certificate",
                rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA) => "unknown_ca",
                rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired) => "no_certificate",
                rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_) => "bad_certificate",
                _ => "tls",
            });
        }
        next = error.source();
    }
    None
}
