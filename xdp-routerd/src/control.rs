//! The control socket: a root-only Unix socket through which `xdp-routerd status|fastpath|flows`
//! reach the running daemon. One JSON request line, one JSON response line.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::{fs::PermissionsExt as _, net::UnixStream},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, anyhow, bail};
use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _},
    net::UnixListener,
};
use tracing::{debug, info, warn};

/// A request from a control command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Everything `status` shows.
    Status,
    /// Switch the fast path on or off.
    Fastpath { on: bool },
    /// Set how long a kernel verdict holds (`verdict_max_age_ms`; 0 = until the ruleset
    /// changes), live.
    VerdictAge { ms: u64 },
    /// The offloaded flows.
    Flows,
}

/// The response envelope.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    /// Whether the request succeeded.
    pub ok: bool,
    /// The payload (status, flows, ...) on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// What went wrong otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Something that answers control requests (the daemon).
pub trait Handler: Send + Sync + 'static {
    /// Answers one request.
    fn handle(&self, req: Request) -> anyhow::Result<serde_json::Value>;
}

/// Binds the control socket at `path` (mode 0600, parent created 0700; a stale socket from a
/// dead daemon is replaced, a live one is an error).
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            bail!(
                "another xdp-routerd is already running (control socket {} answers)",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("cannot bind control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// How long the control socket waits after a failed `accept()`.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// Serves requests for as long as the daemon runs. Each connection carries one request.
pub async fn serve(listener: UnixListener, handler: std::sync::Arc<dyn Handler>) {
    // Failed accepts in a row: logged once when a streak starts, and once when it ends.
    let mut failing = 0u64;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE/ENFILE/ENOMEM persist until something is freed: retrying at once would
                // spin a core. Wait a little instead, and say so once per streak.
                if failing == 0 {
                    warn!(error = %e, "control socket: accept failed; retrying every 100 ms");
                }
                failing += 1;
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        if failing > 0 {
            info!(failed = failing, "control socket: accepting again");
            failing = 0;
        }
        let handler = handler.clone();
        let accepted = std::time::Instant::now();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            let mut reader = tokio::io::BufReader::new(read);
            if reader.read_line(&mut line).await.is_err() {
                return;
            }
            let resp = match serde_json::from_str::<Request>(&line) {
                Ok(req) => {
                    let h = handler.clone();
                    let read_ms = accepted.elapsed().as_secs_f64() * 1e3;
                    let answer = tokio::task::spawn_blocking(move || {
                        let started = std::time::Instant::now();
                        (h.handle(req), started)
                    })
                    .await
                    .map(|(answer, started)| {
                        debug!(
                            target: "xdp_routerd::requests",
                            read_ms,
                            queued_ms = (started - accepted).as_secs_f64() * 1e3 - read_ms,
                            handled_ms = started.elapsed().as_secs_f64() * 1e3,
                            "control request"
                        );
                        answer
                    });
                    match answer {
                        Ok(Ok(data)) => Response {
                            ok: true,
                            data: Some(data),
                            error: None,
                        },
                        Ok(Err(e)) => Response {
                            ok: false,
                            data: None,
                            error: Some(format!("{e:#}")),
                        },
                        Err(e) => Response {
                            ok: false,
                            data: None,
                            error: Some(e.to_string()),
                        },
                    }
                }
                Err(e) => Response {
                    ok: false,
                    data: None,
                    error: Some(format!("bad request: {e}")),
                },
            };
            let mut out = serde_json::to_vec(&resp).unwrap_or_default();
            out.push(b'\n');
            let _ = write.write_all(&out).await;
        });
    }
}

/// Sends one request to the daemon at `path` and returns its data, or a one-line error.
pub fn call(path: &PathBuf, req: &Request) -> anyhow::Result<serde_json::Value> {
    let mut stream = UnixStream::connect(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => anyhow!(
            "no xdp-routerd is running (nothing answers on {}); start it with `xdp-routerd run --config FILE`",
            path.display()
        ),
        std::io::ErrorKind::PermissionDenied => {
            anyhow!("permission denied on {}: the control socket is root-only", path.display())
        }
        _ => anyhow!("cannot connect to {}: {e}", path.display()),
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut resp = String::new();
    BufReader::new(stream)
        .read_line(&mut resp)
        .context("no answer from xdp-routerd")?;
    let resp: Response =
        serde_json::from_str(&resp).context("malformed answer from xdp-routerd")?;
    if resp.ok {
        Ok(resp.data.unwrap_or(serde_json::Value::Null))
    } else {
        Err(anyhow!(
            resp.error.unwrap_or_else(|| "unknown error".into())
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    struct Echo;
    impl Handler for Echo {
        fn handle(&self, req: Request) -> anyhow::Result<serde_json::Value> {
            match req {
                Request::Fastpath { on: false } => bail!("refused"),
                other => Ok(serde_json::to_value(other)?),
            }
        }
    }

    #[test]
    fn request_wire_format_is_stable() {
        assert_eq!(
            serde_json::to_string(&Request::Status).unwrap(),
            r#"{"cmd":"status"}"#
        );
        assert_eq!(
            serde_json::to_string(&Request::Fastpath { on: true }).unwrap(),
            r#"{"cmd":"fastpath","on":true}"#
        );
    }

    #[tokio::test]
    async fn round_trip_over_a_real_socket() {
        let dir = std::env::temp_dir().join(format!("xr-ctl-{}", std::process::id()));
        let path = dir.join("ctl.sock");
        let listener = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        tokio::spawn(serve(listener, Arc::new(Echo)));
        let p = path.clone();
        let got = tokio::task::spawn_blocking(move || call(&p, &Request::Flows))
            .await
            .unwrap();
        assert_eq!(got.unwrap(), serde_json::json!({"cmd": "flows"}));
        let p = path.clone();
        let err = tokio::task::spawn_blocking(move || call(&p, &Request::Fastpath { on: false }))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(err.to_string(), "refused");
        // A second daemon must not steal a live socket.
        assert!(
            bind(&path)
                .unwrap_err()
                .to_string()
                .contains("already running")
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn no_daemon_is_a_one_line_error() {
        let err = call(&PathBuf::from("/nonexistent/xr.sock"), &Request::Status).unwrap_err();
        assert!(
            err.to_string().starts_with("no xdp-routerd is running"),
            "{err}"
        );
    }
}
