//! The error a reconcile ends with, and its kind for the errors-by-kind metric.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} {object}: {source}")]
    Kube {
        action: &'static str,
        object: String,
        source: kube::Error,
    },
    #[error(transparent)]
    Memory(#[from] crate::driver::MemoryError),
    #[error("not writing: this replica's lease was not renewed within its renew deadline")]
    NotLeading,
}

impl Error {
    /// For the errors-by-kind metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube { source, .. } => match source {
                kube::Error::Api(e) if e.code == 409 => "conflict",
                kube::Error::Api(e) if e.code == 403 => "forbidden",
                kube::Error::Api(e) if e.code == 422 => "invalid",
                kube::Error::Api(_) => "api",
                _ => "transport",
            },
            Error::Memory(_) => "persisted_state",
            Error::NotLeading => "not_leading",
        }
    }
}

pub(super) fn kube_err(action: &'static str, object: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube {
        action,
        object,
        source,
    }
}
