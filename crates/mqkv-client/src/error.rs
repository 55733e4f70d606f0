//! What can go wrong, as types.
//!
//! Invariant: a state store `-ERR` answer always surfaces as
//! [`Error::Server`], carrying the server's [`ErrorKind`] when the text is
//! one of the twelve the protocol fixes and the exact text otherwise, so
//! callers can match on the kind and newer servers' texts are never lost.

use std::time::Duration;

use mqkv_protocol::ErrorKind;

/// An error the state store itself reported (`-ERR <text>`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerError {
    /// One of the error texts the protocol defines.
    #[error("{0}")]
    Known(ErrorKind),
    /// A text this client does not know; kept verbatim.
    #[error("{0}")]
    Unknown(String),
}

impl ServerError {
    /// The protocol's error kind, if the text was a known one.
    ///
    /// ```
    /// use mqkv_client::{ErrorKind, ServerError};
    ///
    /// assert_eq!(ServerError::Known(ErrorKind::SyntaxError).kind(), Some(ErrorKind::SyntaxError));
    /// assert_eq!(ServerError::Unknown("new".into()).kind(), None);
    /// ```
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            ServerError::Known(kind) => Some(*kind),
            ServerError::Unknown(_) => None,
        }
    }

    /// The error text exactly as the server sent it.
    ///
    /// ```
    /// use mqkv_client::{ErrorKind, ServerError};
    ///
    /// assert_eq!(ServerError::Known(ErrorKind::SyntaxError).message(), "syntax error");
    /// assert_eq!(ServerError::Unknown("new".into()).message(), "new");
    /// ```
    pub fn message(&self) -> &str {
        match self {
            ServerError::Known(kind) => kind.message(),
            ServerError::Unknown(text) => text,
        }
    }
}

/// Everything a client call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The first connection to the broker could not be made.
    #[error("cannot connect to {address}: {reason}")]
    Connect {
        /// `host:port` that was tried.
        address: String,
        /// What the network or the broker said.
        reason: String,
    },
    /// No answer arrived within the request timeout.
    #[error("no answer from the state store within {0:?}")]
    Timeout(Duration),
    /// The state store answered with an error. (Not a `source`: the text already says it,
    /// and a report of the error chain would say it twice.)
    #[error("the state store refused the request: {0}")]
    Server(ServerError),
    /// The answer did not follow the protocol (wrong status, malformed
    /// payload, an answer that does not fit the request).
    #[error("unexpected answer to {command}: {detail}")]
    Protocol {
        /// The request verb.
        command: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The broker refused to subscribe the client to the response or
    /// notification topic, so no answer could ever arrive.
    #[error("the broker refused the subscription to {0}")]
    SubscriptionRefused(String),
    /// A caller-supplied argument is not acceptable (empty key, client id
    /// with topic wildcards, zero expiry, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// The request would exceed the largest packet the broker accepts.
    #[error("the request needs {size} bytes but the broker accepts at most {limit}")]
    TooLarge {
        /// Approximate packet size of the request.
        size: usize,
        /// The broker's maximum packet size.
        limit: usize,
    },
    /// The client was shut down.
    #[error("the client is closed")]
    Closed,
}

impl From<ServerError> for Error {
    fn from(e: ServerError) -> Error {
        Error::Server(e)
    }
}

impl Error {
    /// The server's error kind, when this is a known state store error.
    ///
    /// ```
    /// use mqkv_client::{Error, ServerError};
    /// use mqkv_protocol::ErrorKind;
    ///
    /// let e = Error::Server(ServerError::Known(ErrorKind::MissingFencingToken));
    /// assert_eq!(e.server_kind(), Some(ErrorKind::MissingFencingToken));
    /// ```
    pub fn server_kind(&self) -> Option<ErrorKind> {
        match self {
            Error::Server(e) => e.kind(),
            _ => None,
        }
    }

    pub(crate) fn protocol(command: &'static str, detail: impl Into<String>) -> Error {
        Error::Protocol {
            command,
            detail: detail.into(),
        }
    }
}

/// Result of a client call.
pub type Result<T, E = Error> = std::result::Result<T, E>;
