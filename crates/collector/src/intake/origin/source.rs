//! Where a container's tags come from: the Docker Engine API (`GET /containers/json` on its
//! Unix socket) and the kubelet's pod list (`GET /pods`, over HTTPS with the service
//! account's token). Each is listed whole, so that one request learns every container of
//! the host, the way the Datadog agent's tagger watches its sources rather than asking
//! per metric.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Deserialize;

use super::Cardinality;

/// Largest response read from a source (a kubelet with 250 pods answers ~2 MB).
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// A container's tags, by the cardinality tier that adds them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OriginTags {
    /// Tags of the lowest tier, and of every tier above it.
    pub low: Vec<(String, String)>,
    /// Tags of `orchestrator` and `high`: the pod's name.
    pub orchestrator: Vec<(String, String)>,
    /// Tags of `high` only: the container id.
    pub high: Vec<(String, String)>,
}

impl OriginTags {
    /// The tags of `cardinality`, in DogStatsD form (`key:value,…`) and canonical order
    /// (what a series id holds), values cleaned of the bytes that would end a tag or a line.
    pub fn render(&self, cardinality: Cardinality) -> Arc<[u8]> {
        let tiers: &[&Vec<(String, String)>] = match cardinality {
            Cardinality::Low => &[&self.low],
            Cardinality::Orchestrator => &[&self.low, &self.orchestrator],
            Cardinality::High => &[&self.low, &self.orchestrator, &self.high],
        };
        let mut out = Vec::new();
        for (key, value) in tiers.iter().flat_map(|tier| tier.iter()) {
            if key.is_empty() || value.is_empty() {
                continue;
            }
            if !out.is_empty() {
                out.push(b',');
            }
            push_clean(&mut out, key);
            out.push(b':');
            push_clean(&mut out, value);
        }
        let mut canonical = Vec::with_capacity(out.len());
        tessera_core::series::canonical_tags(&out, &mut canonical);
        canonical.into()
    }
}

/// Appends `text` with `,`, `|`, `#` and control bytes made `_`: a tag cannot hold them.
fn push_clean(out: &mut Vec<u8>, text: &str) {
    out.extend(text.bytes().map(|byte| match byte {
        b',' | b'|' | b'#' => b'_',
        byte if byte.is_ascii_control() => b'_',
        byte => byte,
    }));
}

/// What one listing of a source found.
#[derive(Debug, Default)]
pub struct Listing {
    /// Tags by container id.
    pub containers: HashMap<String, OriginTags>,
    /// Tags by pod uid and container name (DogStatsD's external data).
    pub pods: HashMap<(String, String), OriginTags>,
}

impl Listing {
    /// Adds `other`'s entries; an entry both have keeps the tags of both.
    pub fn merge(&mut self, other: Listing) {
        fn add<K: std::hash::Hash + Eq>(into: &mut HashMap<K, OriginTags>, from: HashMap<K, OriginTags>) {
            for (key, tags) in from {
                let entry = into.entry(key).or_default();
                entry.low.extend(tags.low);
                entry.orchestrator.extend(tags.orchestrator);
                entry.high.extend(tags.high);
            }
        }
        add(&mut self.containers, other.containers);
        add(&mut self.pods, other.pods);
    }
}

/// Why a source could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Connecting, the TLS handshake, or the request failed.
    #[error("{0}")]
    Transport(String),
    /// The source answered with a status other than 200.
    #[error("status {0}")]
    Status(u16),
    /// The answer is not the JSON expected.
    #[error("bad response: {0}")]
    Body(String),
    /// No answer within the lookup timeout.
    #[error("timed out")]
    Timeout,
}

impl SourceError {
    /// The `result` label of `origin_lookups_total`.
    pub fn result(&self) -> &'static str {
        match self {
            SourceError::Timeout => "timeout",
            _ => "error",
        }
    }
}

// ---- Docker ----

/// The Docker Engine API on its Unix socket.
#[derive(Debug, Clone)]
pub struct Docker {
    /// The socket (`/var/run/docker.sock`).
    pub socket: PathBuf,
    /// Container labels copied as tags (low cardinality), by name.
    pub labels: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerContainer {
    id: String,
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    image: String,
    #[serde(default)]
    labels: Option<HashMap<String, String>>,
}

impl Docker {
    /// Every running container, with its tags.
    pub async fn list(&self) -> Result<Listing, SourceError> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|error| SourceError::Transport(format!("{}: {error}", self.socket.display())))?;
        let body = get(stream, "localhost", "/containers/json", None).await?;
        self.listing(&body)
    }

    fn listing(&self, body: &[u8]) -> Result<Listing, SourceError> {
        let containers: Vec<DockerContainer> =
            serde_json::from_slice(body).map_err(|error| SourceError::Body(error.to_string()))?;
        let mut listing = Listing::default();
        for container in containers {
            let mut tags = OriginTags::default();
            image_tags(&container.image, &mut tags.low);
            let labels = container.labels.unwrap_or_default();
            copy_labels(&self.labels, &labels, &mut tags.low);
            if let Some(name) = container.names.first() {
                tags.orchestrator.push(("container_name".into(), name.trim_start_matches('/').into()));
            }
            tags.high.push(("container_id".into(), container.id.clone()));
            listing.containers.insert(container.id, tags);
        }
        Ok(listing)
    }
}

/// `image_name`, `short_image` and `image_tag` of an image reference
/// (`registry:5000/team/app:1.2`, `app@sha256:…`).
fn image_tags(image: &str, into: &mut Vec<(String, String)>) {
    if image.is_empty() || image.starts_with("sha256:") {
        return;
    }
    let image = image.split('@').next().unwrap_or(image);
    let last_slash = image.rfind('/').map_or(0, |slash| slash + 1);
    let (name, tag) = match image[last_slash..].rfind(':') {
        Some(colon) => (&image[..last_slash + colon], &image[last_slash + colon + 1..]),
        None => (image, "latest"),
    };
    into.push(("image_name".into(), name.into()));
    into.push(("short_image".into(), name[last_slash.min(name.len())..].into()));
    into.push(("image_tag".into(), tag.into()));
}

fn copy_labels(wanted: &[String], labels: &HashMap<String, String>, into: &mut Vec<(String, String)>) {
    for name in wanted {
        if let Some(value) = labels.get(name) {
            into.push((name.clone(), value.clone()));
        }
    }
}

// ---- the kubelet ----

/// The kubelet's pod list.
#[derive(Clone)]
pub struct Kubelet {
    /// `https://<node>:10250/pods`.
    pub url: hyper::Uri,
    /// The bearer token's file, read at each listing (tokens are rotated).
    pub token_file: Option<PathBuf>,
    /// The TLS settings, for an `https` URL.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Pod labels copied as tags (low cardinality), by name.
    pub labels: Vec<String>,
}

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    items: Vec<Pod>,
}

#[derive(Deserialize)]
struct Pod {
    metadata: PodMetadata,
    #[serde(default)]
    status: PodStatus,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodMetadata {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    labels: HashMap<String, String>,
    #[serde(default)]
    owner_references: Vec<OwnerReference>,
}

#[derive(Deserialize)]
struct OwnerReference {
    kind: String,
    name: String,
    #[serde(default)]
    controller: bool,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PodStatus {
    #[serde(default)]
    container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    init_container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    ephemeral_container_statuses: Vec<ContainerStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerStatus {
    name: String,
    #[serde(default, rename = "containerID")]
    container_id: String,
    #[serde(default)]
    image: String,
}

impl Kubelet {
    /// Every pod of the node and its containers, with their tags.
    pub async fn list(&self) -> Result<Listing, SourceError> {
        let host = self.url.host().unwrap_or("localhost").to_owned();
        let https = self.url.scheme_str() == Some("https");
        let port = self.url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let path = self.url.path_and_query().map_or("/pods", |path| path.as_str()).to_owned();
        let token = match &self.token_file {
            Some(file) => Some(
                std::fs::read_to_string(file)
                    .map_err(|error| SourceError::Transport(format!("token {}: {error}", file.display())))?
                    .trim()
                    .to_owned(),
            ),
            None => None,
        };
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|error| SourceError::Transport(format!("{host}:{port}: {error}")))?;
        let body = match (&self.tls, https) {
            (Some(tls), true) => {
                let name = rustls::pki_types::ServerName::try_from(host.clone())
                    .map_err(|error| SourceError::Transport(format!("{host}: {error}")))?;
                let stream = tokio_rustls::TlsConnector::from(Arc::clone(tls))
                    .connect(name, tcp)
                    .await
                    .map_err(|error| SourceError::Transport(format!("TLS to {host}:{port}: {error}")))?;
                get(stream, &host, &path, token.as_deref()).await?
            }
            _ => get(tcp, &host, &path, token.as_deref()).await?,
        };
        self.listing(&body)
    }

    fn listing(&self, body: &[u8]) -> Result<Listing, SourceError> {
        let pods: PodList = serde_json::from_slice(body).map_err(|error| SourceError::Body(error.to_string()))?;
        let mut listing = Listing::default();
        for pod in pods.items {
            let metadata = &pod.metadata;
            let mut pod_tags = vec![("kube_namespace".to_owned(), metadata.namespace.clone())];
            if let Some((key, name)) = owner_tag(metadata) {
                pod_tags.push((key, name));
            }
            copy_labels(&self.labels, &metadata.labels, &mut pod_tags);
            let statuses = pod.status.container_statuses.iter();
            let statuses =
                statuses.chain(&pod.status.init_container_statuses).chain(&pod.status.ephemeral_container_statuses);
            for status in statuses {
                let mut tags = OriginTags { low: pod_tags.clone(), ..OriginTags::default() };
                tags.low.push(("kube_container_name".into(), status.name.clone()));
                image_tags(&status.image, &mut tags.low);
                tags.orchestrator.push(("pod_name".into(), metadata.name.clone()));
                // `containerd://<id>`, `docker://<id>`, `cri-o://<id>`; empty while it starts.
                let id = status.container_id.rsplit("://").next().unwrap_or_default();
                if !id.is_empty() {
                    tags.high.push(("container_id".into(), id.to_owned()));
                    listing.containers.insert(id.to_owned(), tags.clone());
                }
                listing.pods.insert((metadata.uid.clone(), status.name.clone()), tags);
            }
        }
        Ok(listing)
    }
}

/// The tag of a pod's controller: `kube_deployment` for a ReplicaSet made by a Deployment
/// (its name less the pod template hash), else `kube_<kind>` of the owner itself.
fn owner_tag(metadata: &PodMetadata) -> Option<(String, String)> {
    let owner = metadata.owner_references.iter().find(|owner| owner.controller)?;
    let named = |tag: &str| Some((tag.to_owned(), owner.name.clone()));
    match owner.kind.as_str() {
        "ReplicaSet" => match metadata.labels.get("pod-template-hash") {
            Some(hash) if owner.name.ends_with(&format!("-{hash}")) => {
                Some(("kube_deployment".into(), owner.name[..owner.name.len() - hash.len() - 1].into()))
            }
            _ => named("kube_replica_set"),
        },
        "StatefulSet" => named("kube_statefulset"),
        "DaemonSet" => named("kube_daemonset"),
        "Job" => named("kube_job"),
        "CronJob" => named("kube_cronjob"),
        other => Some(("kube_ownerref_kind".into(), other.to_lowercase())),
    }
}

/// `GET path` over `stream` (HTTP/1.1, one request), with a bearer token when given;
/// the body of a 200 answer.
async fn get<S>(stream: S, host: &str, path: &str, token: Option<&str>) -> Result<Vec<u8>, SourceError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let transport = |error: hyper::Error| SourceError::Transport(error.to_string());
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream)).await.map_err(transport)?;
    tokio::spawn(async move {
        // Ends when the answer is read and the sender dropped; its error is the request's.
        let _ = connection.await;
    });
    let mut request = hyper::Request::get(path).header(hyper::header::HOST, host);
    if let Some(token) = token {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request.body(Empty::new()).map_err(|error| SourceError::Transport(error.to_string()))?;
    let response = sender.send_request(request).await.map_err(transport)?;
    if response.status() != hyper::StatusCode::OK {
        return Err(SourceError::Status(response.status().as_u16()));
    }
    let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|error| SourceError::Transport(error.to_string()))?;
    Ok(body.to_bytes().to_vec())
}

/// Runs `listing` with a timeout.
pub async fn within<F: std::future::Future<Output = Result<Listing, SourceError>>>(
    timeout: Duration,
    listing: F,
) -> Result<Listing, SourceError> {
    tokio::time::timeout(timeout, listing).await.unwrap_or(Err(SourceError::Timeout))
}

/// TLS to a kubelet: the system's roots and `ca_file`, or, with `verify` off, any
/// certificate (most kubelets serve a self-signed one; the Datadog agent's
/// `kubelet_tls_verify: false`). The bearer token still goes only to the configured URL.
pub fn kubelet_tls(ca_file: Option<&std::path::Path>, verify: bool) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?;
    let config = if verify {
        let mut roots = rustls::RootCertStore::empty();
        for certificate in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(certificate);
        }
        if let Some(file) = ca_file {
            for certificate in tessera_wire::load_certs("kubelet CA", file).map_err(|error| error.to_string())? {
                roots.add(certificate).map_err(|error| format!("{}: {error}", file.display()))?;
            }
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))).with_no_client_auth()
    };
    Ok(Arc::new(config))
}

/// Accepts any server certificate, and still checks the handshake's signatures.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(tags: &OriginTags, cardinality: Cardinality) -> String {
        String::from_utf8(tags.render(cardinality).to_vec()).unwrap()
    }

    #[test]
    fn docker_containers_give_image_labels_name_and_id_by_tier() {
        let docker = Docker { socket: PathBuf::new(), labels: vec!["team".into()] };
        let body = br#"[{"Id":"aaa","Names":["/web-1"],"Image":"registry:5000/shop/web:1.2","Labels":{"team":"a,b","other":"x"}},
                        {"Id":"bbb","Names":["/db"],"Image":"sha256:0123","Labels":null}]"#;
        let listing = docker.listing(body).unwrap();
        let web = &listing.containers["aaa"];
        assert_eq!(
            render(web, Cardinality::Low),
            "image_name:registry:5000/shop/web,image_tag:1.2,short_image:web,team:a_b",
            "in canonical order, as a series id holds them"
        );
        assert_eq!(
            render(web, Cardinality::High),
            "container_id:aaa,container_name:web-1,image_name:registry:5000/shop/web,image_tag:1.2,short_image:web,team:a_b"
        );
        assert_eq!(render(&listing.containers["bbb"], Cardinality::Orchestrator), "container_name:db");
    }

    /// Serves `body` once per connection over TLS with the test PKI's server certificate
    /// (for `localhost` and 127.0.0.1); returns the address.
    async fn tls_kubelet(pki: &tessera_testkit::tls::Pki, body: &'static [u8]) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let certs = tessera_wire::load_certs("server", &pki.server_cert).unwrap();
        let key = tessera_wire::load_key("server", &pki.server_key).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(mut stream) = acceptor.accept(tcp).await else { continue };
                let mut request = Vec::new();
                let mut buffer = [0u8; 1024];
                while !request.windows(4).any(|end| end == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(body).await;
                let _ = stream.shutdown().await;
            }
        });
        address
    }

    #[tokio::test]
    async fn a_kubelet_over_tls_is_listed_with_its_ca_or_with_verification_off_and_refused_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let pki = tessera_testkit::tls::Pki::create(dir.path());
        let address = tls_kubelet(&pki, include_bytes!("../../../tests/data/kubelet-pods.json")).await;
        let kubelet = |tls| Kubelet {
            url: format!("https://127.0.0.1:{}/pods", address.port()).parse().unwrap(),
            token_file: None,
            tls: Some(tls),
            labels: vec![],
        };
        let timeout = Duration::from_secs(10);
        // Its certificate is signed by a CA the system does not know: refused.
        let verified = kubelet(kubelet_tls(None, true).unwrap());
        let refused = within(timeout, verified.list()).await;
        assert!(matches!(&refused, Err(SourceError::Transport(reason)) if reason.contains("TLS")), "{refused:?}");
        // Given the CA, or with verification off (a self-signed kubelet): listed.
        for tls in [kubelet_tls(Some(&pki.ca), true).unwrap(), kubelet_tls(None, false).unwrap()] {
            let listing = within(timeout, kubelet(tls).list()).await.unwrap();
            assert_eq!(listing.containers.len(), 4, "every container with an id");
        }
    }

    #[test]
    fn kubelet_pods_give_namespace_owner_container_and_pod_by_tier() {
        let kubelet = Kubelet { url: "http://x/pods".parse().unwrap(), token_file: None, tls: None, labels: vec![] };
        let body = include_bytes!("../../../tests/data/kubelet-pods.json");
        let listing = kubelet.listing(body).unwrap();
        let id = "4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c";
        let web = &listing.containers[id];
        assert_eq!(
            render(web, Cardinality::Low),
            "image_name:shop/web,image_tag:2.0,kube_container_name:app,kube_deployment:web,kube_namespace:shop,short_image:web"
        );
        let orchestrator = render(web, Cardinality::Orchestrator);
        assert!(orchestrator.contains(",pod_name:web-7d4b9c8f6d-x2x9q,") && !orchestrator.contains("container_id"));
        assert!(render(web, Cardinality::High).starts_with(&format!("container_id:{id},")));
        let by_pod = &listing.pods[&("0f1e2d3c-1111-2222-3333-444455556666".to_owned(), "app".to_owned())];
        assert_eq!(by_pod, web, "external data finds the same container");
        let db = listing.pods.values().find(|tags| tags.orchestrator[0].1 == "db-0").unwrap();
        let db = render(db, Cardinality::Low);
        assert!(db.contains("kube_namespace:shop,kube_statefulset:db,"), "{db}");
    }
}
