//! The HTTP side of `/metrics`: binding the listener, serving connections with hyper, and
//! answering requests.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context as _;
use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header,
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tracing::{debug, info, warn};

use super::{CONTENT_TYPE, HostSource, StatusSource, encode, registry};

/// Binds the metrics listener (before anything is attached, so a taken port is a start-up
/// error, not a silent loss of metrics).
pub fn bind(addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr).with_context(|| {
        format!(
            "cannot listen on {addr} for /metrics (metrics_listen in the config; \"\" disables it)"
        )
    })?;
    l.set_nonblocking(true)
        .context("cannot make the metrics listener non-blocking")?;
    Ok(l)
}

/// Serves `/metrics` on `listener` (from [`bind`]) with the current tokio runtime, forever
/// (see [`crate::tasks::metrics`] for where it runs); fails only when the listener cannot be
/// registered with the runtime.
pub async fn serve_listener(
    listener: std::net::TcpListener,
    source: StatusSource,
    hosts: Option<HostSource>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)
        .context("cannot register the metrics listener with tokio")?;
    if let Ok(addr) = listener.local_addr() {
        info!(url = %format!("http://{addr}/metrics"), "serving Prometheus metrics");
    }
    serve(listener, Arc::new(registry(source, hosts))).await;
    Ok(())
}

/// Accepts connections forever; each is served by hyper (HTTP/1.1, keep-alive).
pub async fn serve(listener: tokio::net::TcpListener, registry: Arc<Registry>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, registry.clone()));
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                debug!(error = %e, "metrics: connection ended with an error");
            }
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

async fn handle(
    req: Request<Incoming>,
    registry: Arc<Registry>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET and HEAD\n",
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    Ok(match req.uri().path() {
        "/metrics" => {
            // The status read does map syscalls under the daemon's lock: not on a runtime thread.
            match tokio::task::spawn_blocking(move || encode(&registry)).await {
                Ok(Ok(text)) => reply(StatusCode::OK, CONTENT_TYPE, text),
                _ => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    "cannot encode the metrics\n",
                ),
            }
        }
        "/" => reply(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "xdp-routerd: Prometheus metrics are at /metrics\n",
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try /metrics\n",
        ),
    })
}
