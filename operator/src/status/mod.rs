//! The status plane: the views a runtime publishes ([`view`]), where it publishes them ([`hub`]),
//! and the one axum router that serves them, the trainers' control endpoint and the dashboard
//! ([`router`]), with observer reads paced ([`pacer`]) and admitted by an [`access::Access`],
//! and trainers' posts admitted once ([`replay`]). `murmur run` serves it on loopback to its
//! local user; the operator serves the same router to whom the cluster allows.

pub mod access;
pub mod hub;
mod openapi;
pub mod pacer;
pub mod replay;
pub mod router;
pub mod view;

#[cfg(test)]
mod tests;

pub use hub::{Hub, Inbound, JobHandle, Role};

/// Connections the listen queue holds while the server accepts (the kernel caps it at
/// `net.core.somaxconn`): every trainer of a large job holds its view stream here, and a job's
/// members start together; with tokio's default of 1 024, 10 000 members starting at once were
/// refused connections.
pub const LISTEN_BACKLOG: u32 = 8192;

/// Listen on `address` (`host:port`) for the status API and control endpoint.
pub async fn listen(address: &str) -> std::io::Result<tokio::net::TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host(address).await? {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(addr) {
            Ok(()) => return socket.listen(LISTEN_BACKLOG),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            "no address to listen on",
        )
    }))
}

/// How long a connection may wait for a request's head (idle between requests, or sending one
/// slowly) before it is closed: hyper holds 16 to 24 KiB for each connection. A trainer's post
/// is answered with `Connection: close` (a trainer posts once in seconds; 10 000 members' idle
/// post connections were 170 MB of the operator's memory), and its view stream is no HTTP
/// connection once upgraded, and is not closed: this bounds what other clients hold open.
pub const IDLE_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(murmur_core::contract::control::CONNECTION_IDLE_SECONDS);

/// Serve `router` on `listener` for as long as the task runs, closing connections idle for
/// [`IDLE_TIMEOUT`]. Every connection shares the one routing table (axum's `serve` of a plain
/// router converts the whole table again for each, 6 KiB).
pub async fn serve(listener: tokio::net::TcpListener, router: axum::Router) {
    serve_closing_idle(listener, router, IDLE_TIMEOUT).await
}

async fn serve_closing_idle(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    idle: std::time::Duration,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let routes: axum::Router = router.with_state(());
    let mut connections = hyper::server::conn::http1::Builder::new();
    connections
        .timer(TokioTimer::new())
        .header_read_timeout(idle);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // A connection that failed before it was accepted, or out of file descriptors
            // for a moment: the listener itself is fine.
            Err(e) => {
                tracing::debug!(error = %e, "accepting a connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(routes.clone());
        let connections = connections.clone();
        tokio::spawn(async move {
            // A client gone or timed out ends only its own connection.
            let _ = connections
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        });
    }
}

pub use router::router;
pub use view::{JobEvent, JobView, SeriesPoint};
