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
/// `net.core.somaxconn`): every trainer of a large job long-polls here, and a job's members
/// start together; with tokio's default of 1 024, 10 000 members starting at once were refused
/// connections.
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
/// Serve `router` on `listener`, each connection sharing the one routing table: axum's `serve`
/// of a plain router converts the whole table again for every connection (6 KiB each), and
/// every trainer holds a connection open here.
pub async fn serve(listener: tokio::net::TcpListener, router: axum::Router) -> std::io::Result<()> {
    let routes: axum::Router = router.with_state(());
    axum::serve(listener, routes.into_make_service()).await
}

pub use router::router;
pub use view::{JobEvent, JobView, SeriesPoint};
