//! Why a server could not start.

use node::ModeError;

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The flags ask for something that cannot be (the text names the flags).
    #[error("{0}")]
    Flags(String),
    /// The store could not be opened or initialised (the text says which and why).
    #[error("{0}")]
    Store(String),
    /// The node around the server failed (listeners, TLS, serving).
    #[error("{0}")]
    Node(ModeError),
}

/// An error with its causes, on one line.
pub(crate) use api_client::chain;
