//! Why an agent could not start.

use node::ModeError;

/// Why an agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The flags or config files ask for something that cannot be (the text names them).
    #[error("{0}")]
    Flags(String),
    /// The agent could not start or load its config files.
    #[error("{0}")]
    Agent(String),
    /// The node around the agent failed (listeners, TLS, serving).
    #[error("{0}")]
    Node(ModeError),
}
