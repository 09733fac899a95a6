//! Certificates made in the test, with rcgen: a CA, a server certificate for
//! `localhost` and 127.0.0.1, a client certificate, and a second CA nobody trusts.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let pki = tessera_testkit::tls::Pki::create(dir.path());
//! assert!(std::fs::read_to_string(&pki.server_cert).unwrap().contains("BEGIN CERTIFICATE"));
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// The files of a test PKI, all PEM.
pub struct Pki {
    /// The CA every certificate below is signed by.
    pub ca: PathBuf,
    /// Server certificate for `localhost` and `127.0.0.1`, and its key.
    pub server_cert: PathBuf,
    /// The server certificate's key.
    pub server_key: PathBuf,
    /// A client certificate (CN `collector-1`), and its key.
    pub client_cert: PathBuf,
    /// The client certificate's key.
    pub client_key: PathBuf,
    /// Another CA: trusted by nobody.
    pub other_ca: PathBuf,
    ca_params: Arc<(rcgen::Certificate, KeyPair)>,
    dir: PathBuf,
}

fn ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().expect("a key");
    (params.self_signed(&key).expect("a CA certificate"), key)
}

fn leaf(names: &[&str], common_name: &str, issuer: &(rcgen::Certificate, KeyPair)) -> (String, String) {
    let mut params =
        CertificateParams::new(names.iter().map(|name| (*name).to_owned()).collect::<Vec<_>>()).expect("valid names");
    params.distinguished_name.push(DnType::CommonName, common_name);
    let key = KeyPair::generate().expect("a key");
    let cert = params.signed_by(&key, &issuer.0, &issuer.1).expect("a signed certificate");
    (cert.pem(), key.serialize_pem())
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a PEM file");
    path
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl Pki {
    /// Makes every file in `dir`.
    pub fn create(dir: &Path) -> Pki {
        let authority = ca("tessera test CA");
        let other = ca("untrusted CA");
        let (server_pem, server_key) = leaf(&["localhost", "127.0.0.1"], "localhost", &authority);
        let (client_pem, client_key) = leaf(&["collector-1"], "collector-1", &authority);
        Pki {
            ca: write(dir, "ca.pem", &authority.0.pem()),
            server_cert: write(dir, "server.pem", &server_pem),
            server_key: write(dir, "server-key.pem", &server_key),
            client_cert: write(dir, "client.pem", &client_pem),
            client_key: write(dir, "client-key.pem", &client_key),
            other_ca: write(dir, "other-ca.pem", &other.0.pem()),
            ca_params: Arc::new(authority),
            dir: dir.to_owned(),
        }
    }

    /// A fresh server certificate from the same CA, written over `server_cert` and
    /// `server_key` (a rotation).
    pub fn rotate_server(&self) {
        let (pem, key) = leaf(&["localhost", "127.0.0.1"], "localhost", &self.ca_params);
        // The key first: a reader between the two writes sees a mismatch and keeps the old pair.
        write(&self.dir, "server-key.pem", &key);
        write(&self.dir, "server.pem", &pem);
    }
}

/// A bcrypt hash (cost 4) of [`TEST_PASSWORD`], for Prometheus' `basic_auth_users`.
pub const TEST_PASSWORD_BCRYPT: &str = "$2b$04$.YEEm0Hh2Y8H7TKESvS3uuHGUGVRHqKQU5Qx0f8uKnHgKaJCJoK52";

/// The password of the test stores' user `tessera`.
pub const TEST_PASSWORD: &str = "tessera-test-password";

/// A TLS session to `localhost` at `address`, trusting `ca`, presenting `client`'s
/// certificate when given; the handshake is done on the first read or write.
fn tls_session(
    address: std::net::SocketAddr,
    ca: &Path,
    client: Option<(&Path, &Path)>,
) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>> {
    use rustls::pki_types::pem::PemObject;

    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).map_err(std::io::Error::other)? {
        roots.add(cert.map_err(std::io::Error::other)?).map_err(std::io::Error::other)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => {
            let chain = rustls::pki_types::CertificateDer::pem_file_iter(cert)
                .map_err(std::io::Error::other)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(std::io::Error::other)?;
            let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).map_err(std::io::Error::other)?;
            config.with_client_auth_cert(chain, key).map_err(std::io::Error::other)?
        }
        None => config.with_no_client_auth(),
    };
    let name = rustls::pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    let connection = rustls::ClientConnection::new(Arc::new(config), name).map_err(std::io::Error::other)?;
    let tcp = std::net::TcpStream::connect_timeout(&address, std::time::Duration::from_secs(2))?;
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(60)))?;
    Ok(rustls::StreamOwned::new(connection, tcp))
}

/// The certificate (DER) the TLS server at `address` presents to a new connection, which
/// is verified against `ca` (and, with `client`, shown a client certificate).
pub fn server_certificate(
    address: std::net::SocketAddr,
    ca: &Path,
    client: Option<(&Path, &Path)>,
) -> std::io::Result<Vec<u8>> {
    let mut stream = tls_session(address, ca, client)?;
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock)?;
    }
    let chain = stream.conn.peer_certificates().ok_or_else(|| std::io::Error::other("no server certificate"))?;
    Ok(chain.first().map(|cert| cert.to_vec()).unwrap_or_default())
}

/// A blocking HTTPS GET (HTTP/1.0, the server closes the connection after the answer) to
/// `localhost` at `address`, trusting `ca`, with basic auth when given: status and body.
pub fn https_get(
    address: std::net::SocketAddr,
    path: &str,
    ca: &Path,
    basic_auth: Option<(&str, &str)>,
) -> std::io::Result<(u16, String)> {
    https_get_as(address, path, ca, None, basic_auth)
}

/// [`https_get`] presenting the client certificate `(cert, key)` when given (mutual TLS).
pub fn https_get_as(
    address: std::net::SocketAddr,
    path: &str,
    ca: &Path,
    client: Option<(&Path, &Path)>,
    basic_auth: Option<(&str, &str)>,
) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};

    let mut stream = tls_session(address, ca, client)?;
    let authorization = basic_auth.map_or_else(String::new, |(user, password)| {
        format!("Authorization: Basic {}\r\n", tessera_core::base64::encode(format!("{user}:{password}").as_bytes()))
    });
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n{authorization}\r\n")?;
    let mut response = Vec::new();
    match stream.read_to_end(&mut response) {
        Ok(_) => {}
        // Servers that close without a TLS close_notify: the answer is whole all the same.
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {}
        Err(error) => return Err(error),
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    Ok((status, body.to_owned()))
}
