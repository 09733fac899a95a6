//! The telemetry endpoint, served for real on 127.0.0.1:0 and asked over raw HTTP/1.1.

use std::net::SocketAddr;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tessera_runtime::{Readiness, ServerHandle, Shutdown, Telemetry, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Status code, headers and body of one answer.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// Sends `GET path` with `Connection: close` and reads the whole answer.
async fn get(address: SocketAddr, path: &str) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect(address).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await?;
    let (head, body) = raw.split_once("\r\n\r\n").expect("answer has a header block");
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).expect("status line has a code");
    Ok(Answer { status, head: head.to_owned(), body: body.to_owned() })
}

#[tokio::test]
async fn serves_metrics_health_readiness_and_stops_on_shutdown() {
    let telemetry = Telemetry::new("testd", "1.2.3");
    let requests = Counter::<u64>::default();
    telemetry.register("tessera_testd_requests", "Requests handled", requests.clone());
    requests.inc_by(7);
    let readiness = Readiness::new();
    let warmed_up = readiness.condition("warmed up");
    let shutdown = Shutdown::new();

    let server = serve(([127, 0, 0, 1], 0).into(), telemetry, readiness, shutdown.clone()).await.expect("binds");
    let address = server.local_addr();
    assert_ne!(address.port(), 0);

    let metrics = get(address, "/metrics").await.expect("metrics answer");
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.head.to_ascii_lowercase().contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{}",
        metrics.head
    );
    assert!(metrics.body.contains(r#"tessera_build_info{daemon="testd",version="1.2.3"} 1"#), "{}", metrics.body);
    assert!(metrics.body.contains("tessera_testd_requests_total 7"), "{}", metrics.body);
    assert!(metrics.body.contains("tessera_testd_up 1"), "{}", metrics.body);
    assert!(metrics.body.contains("process_start_time_seconds "), "{}", metrics.body);
    if cfg!(target_os = "linux") {
        assert!(metrics.body.contains("process_cpu_seconds_total "), "{}", metrics.body);
        assert!(metrics.body.contains("process_resident_memory_bytes "), "{}", metrics.body);
    }
    assert!(metrics.body.ends_with("# EOF\n"));

    let health = get(address, "/healthz").await.expect("healthz answer");
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));

    let not_ready = get(address, "/readyz").await.expect("readyz answer");
    assert_eq!(not_ready.status, 503);
    assert!(not_ready.body.contains("warmed up"), "{}", not_ready.body);
    warmed_up.mark_ready();
    let ready = get(address, "/readyz").await.expect("readyz answer");
    assert_eq!(ready.status, 200);

    let refused = get(address, "/debug/pprof/profile?seconds=0").await.expect("profile answer");
    assert_eq!(refused.status, 400);
    assert!(refused.body.contains("`seconds` must be 1 to 300"), "{}", refused.body);
    let heap = get(address, "/debug/pprof/heap").await.expect("heap answer");
    assert_eq!(heap.status, 501);
    assert!(heap.body.contains("system allocator"), "{}", heap.body);

    let unknown = get(address, "/nope").await.expect("404 answer");
    assert_eq!(unknown.status, 404);
    assert!(unknown.body.contains("/metrics"), "the 404 names the paths served: {}", unknown.body);

    // The dashboard page and its assets, self-contained: nothing loaded from another origin.
    let page = get(address, "/").await.expect("dashboard answer");
    assert_eq!(page.status, 200);
    assert!(page.head.to_ascii_lowercase().contains("content-type: text/html"), "{}", page.head);
    assert!(page.body.contains("src=\"/dashboard.js\"") && page.body.contains("href=\"/dashboard.css\""));
    for asset in ["/dashboard.js", "/dashboard.css"] {
        let answer = get(address, asset).await.expect("asset answer");
        assert_eq!(answer.status, 200, "{asset}");
        let body = answer.body.replace("http://www.w3.org/2000/svg", "");
        assert!(!body.contains("http://") && !body.contains("https://"), "{asset} loads nothing from elsewhere");
    }
    let data = get(address, "/dashboard/data?since=0").await.expect("dashboard data answer");
    assert_eq!(data.status, 200);
    assert!(data.body.contains("\"daemon\":\"testd\""), "{}", data.body);

    // A long profile in progress does not hold shutdown back: it ends early.
    let profiling = tokio::spawn(async move { get(address, "/debug/pprof/profile?seconds=300").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(10), server.stopped())
        .await
        .expect("server stops within 10 s of the shutdown signal")
        .expect("server stopped cleanly");
    assert!(get(address, "/healthz").await.is_err(), "listener is closed after shutdown");
    // The profile was answered (a gzipped body, not text) before the server stopped.
    let _ = profiling.await;
}

/// The endpoint of a daemon named `name` with nothing registered, served on 127.0.0.1:0.
async fn serve_on_a_free_port(name: &str, shutdown: &Shutdown) -> ServerHandle {
    serve(([127, 0, 0, 1], 0).into(), Telemetry::new(name, "0"), Readiness::new(), shutdown.clone())
        .await
        .expect("binds")
}

#[tokio::test]
async fn with_profiling_off_the_profiler_answers_403_and_counts_it_and_the_rest_is_served() {
    let shutdown = Shutdown::new();
    let telemetry = Telemetry::new("testd", "0");
    telemetry.set_profiling(false);
    let server = serve(([127, 0, 0, 1], 0).into(), telemetry, Readiness::new(), shutdown.clone()).await.expect("binds");
    let address = server.local_addr();
    let refused = get(address, "/debug/pprof/profile?seconds=1").await.expect("profile answer");
    assert_eq!(refused.status, 403);
    assert!(refused.body.contains("profiling = false"), "{}", refused.body);
    let metrics = get(address, "/metrics").await.expect("metrics answer");
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.body.contains("tessera_testd_profile_requests_refused_total{reason=\"disabled\"} 1"),
        "{}",
        metrics.body
    );
    assert_eq!(get(address, "/healthz").await.expect("healthz answer").status, 200);
    shutdown.trigger();
    server.stopped().await.expect("server stopped cleanly");
}

#[tokio::test]
async fn binding_a_taken_address_names_it() {
    let shutdown = Shutdown::new();
    let first = serve_on_a_free_port("a", &shutdown).await;
    let error = serve(first.local_addr(), Telemetry::new("b", "0"), Readiness::new(), shutdown.clone())
        .await
        .expect_err("address is taken");
    assert!(error.to_string().contains(&first.local_addr().to_string()), "{error}");
    shutdown.trigger();
    first.stopped().await.expect("server stopped cleanly");
}

#[tokio::test]
async fn shutdown_closes_idle_keep_alive_connections() {
    let shutdown = Shutdown::new();
    let server = serve_on_a_free_port("testd", &shutdown).await;
    // A scraper keeps its connection open between scrapes; that must not hold up shutdown.
    let mut scraper = TcpStream::connect(server.local_addr()).await.expect("connects");
    scraper.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n").await.expect("sends");
    let mut answer = Vec::new();
    while !answer.ends_with(b"ok\n") {
        let mut chunk = [0u8; 512];
        let read = scraper.read(&mut chunk).await.expect("reads");
        assert_ne!(read, 0, "connection stays open after a keep-alive answer");
        answer.extend_from_slice(&chunk[..read]);
    }

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(10), server.stopped())
        .await
        .expect("server stops despite an idle keep-alive connection")
        .expect("server stopped cleanly");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), scraper.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "idle connection is closed: {read:?}");
}
