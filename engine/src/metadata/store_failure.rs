//! What went wrong with a metadata store (HTTP or etcd), case by case: the bad URL or
//! endpoint list, the request that failed with the client's error as source, or the answer
//! that cannot be used, with what it said.

use std::time::Duration;

use thiserror::Error;

use super::RpcMeta;
use crate::error::Fault;
use crate::wire::WireError;

/// Why a metadata store failed a request, or could not be used at all.
#[derive(Debug, Error)]
pub enum StoreFailure {
    /// HTTP: not an `http://` URL.
    #[error("only http:// URLs are supported (this build has no TLS)")]
    NotHttp,
    /// HTTP: the URL names no host.
    #[error("the URL has no host")]
    NoHost,
    /// HTTP: the URL has a query or fragment of its own.
    #[error("the URL must not have a query or fragment (the key is added as ?key=...)")]
    QueryOrFragment,
    /// HTTP: the HTTP client cannot parse the URL.
    #[error("not a valid URL: {0}")]
    BadUrl(#[source] ureq::http::uri::InvalidUri),
    /// etcd: the endpoint list is unusable.
    #[error(transparent)]
    Endpoints(#[from] EndpointError),
    /// HTTP: the request got no answer.
    #[error("{method} {key}: {source}")]
    Request {
        /// `GET`, `PUT` or `DELETE`.
        method: &'static str,
        /// The key asked for.
        key: String,
        /// The HTTP client's error.
        #[source]
        source: ureq::Error,
    },
    /// HTTP: the answer's body could not be read.
    #[error("{method} {key}: reading the reply: {source}")]
    ReadReply {
        /// `GET`, `PUT` or `DELETE`.
        method: &'static str,
        /// The key asked for.
        key: String,
        /// The HTTP client's error.
        #[source]
        source: ureq::Error,
    },
    /// HTTP: an answer with a status other than success.
    #[error("{0}")]
    Status(HttpAnswer),
    /// HTTP: the key just written reads back with a status other than success.
    #[error("key {key} just written reads back with status {status} ({body})")]
    ReadBackStatus {
        /// The key.
        key: String,
        /// The status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The key just written reads back as another engine's: it took the name meanwhile.
    /// (Boxed values here and below keep every engine error small to return.)
    #[error("key {key} reads back as {found:?} instead of {ours:?}: another engine took the name {name:?}")]
    TakenOver {
        /// The key.
        key: String,
        /// What it holds.
        found: Box<RpcMeta>,
        /// What we wrote.
        ours: Box<RpcMeta>,
        /// The segment name.
        name: String,
    },
    /// HTTP: the key just written reads back as something that does not decode.
    #[error("key {key} reads back as garbage ({source}): {body}")]
    ReadBackGarbage {
        /// The key.
        key: String,
        /// Why it does not decode.
        #[source]
        source: WireError,
        /// The start of what it holds.
        body: String,
    },
    /// etcd: the key just written reads back as something else (or nothing usable).
    #[error("key {key} just written reads back as {found:?}")]
    ReadBack {
        /// The key.
        key: String,
        /// What it decoded to.
        found: Result<RpcMeta, WireError>,
    },
    /// HTTP: our `rpc_meta` write was refused, and the entry there does not decode.
    #[error("{refused}; the existing entry is garbage: {source}")]
    StaleEntryGarbage {
        /// The refused write.
        refused: Box<HttpAnswer>,
        /// Why the entry does not decode.
        #[source]
        source: WireError,
    },
    /// HTTP: our `rpc_meta` write was refused, and deleting the stale entry failed.
    #[error("{refused}; DELETE of the stale entry answered {status}")]
    StaleEntryKept {
        /// The refused write.
        refused: HttpAnswer,
        /// The DELETE's status.
        status: u16,
    },
    /// A stored value that does not decode.
    #[error("GET {key}: unusable value: {source}")]
    UnusableValue {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: WireError,
    },
    /// The segment name belongs to a live engine elsewhere.
    #[error("segment name {name:?} is in use by a live engine at {at}")]
    NameInUse {
        /// The name.
        name: String,
        /// That engine's handshake address.
        at: String,
    },
    /// etcd: a stored value that is not UTF-8.
    #[error("GET {key}: value is not UTF-8: {source}")]
    NotUtf8 {
        /// The key.
        key: String,
        /// The client's error.
        #[source]
        source: mooncake_etcd::Error,
    },
    /// etcd: the client's runtime could not start.
    #[error("cannot start its runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// etcd: the store is closed (the engine is shutting down).
    #[error("the store is closed")]
    Closed,
    /// etcd: an operation kept failing until its deadline.
    #[error("{op} {key}: failed for {limit:?}; last error: {last}")]
    Deadline {
        /// `PUT`, `GET`, `connect`, `lease grant`, ...
        op: &'static str,
        /// The key (empty for operations on none).
        key: String,
        /// How long it was tried.
        limit: Duration,
        /// How the last attempt failed.
        #[source]
        last: EtcdAttempt,
    },
}

impl StoreFailure {
    /// Whose failure this is: a bad address or a name another live engine holds is the
    /// caller's to fix; the rest is the store's reachability or health, from this host.
    pub fn fault(&self) -> Fault {
        match self {
            Self::NotHttp
            | Self::NoHost
            | Self::QueryOrFragment
            | Self::BadUrl(_)
            | Self::Endpoints(_)
            | Self::NameInUse { .. }
            | Self::TakenOver { .. } => Fault::Caller,
            _ => Fault::Host,
        }
    }
}

/// An HTTP answer that is not success: what was asked and what came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAnswer {
    /// `GET`, `PUT` or `DELETE`.
    pub method: &'static str,
    /// The key.
    pub key: String,
    /// The status.
    pub status: u16,
    /// The start of the body, quoted.
    pub body: String,
}

impl std::fmt::Display for HttpAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} answered {} ({})",
            self.method, self.key, self.status, self.body
        )
    }
}

/// How the last attempt of an etcd operation failed.
#[derive(Debug, Error)]
pub enum EtcdAttempt {
    /// The client's error.
    #[error("{0}")]
    Failed(#[source] mooncake_etcd::Error),
    /// No answer before the deadline.
    #[error("no answer")]
    NoAnswer,
}

/// What is wrong with an etcd endpoint list (`h1:2379,h2:2379`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EndpointError {
    /// Two separators in a row, or one at an end.
    #[error("empty endpoint in {list:?}")]
    Empty {
        /// The list.
        list: String,
    },
    /// An endpoint with a scheme.
    #[error("endpoint {endpoint:?}: give host:port without a scheme")]
    Scheme {
        /// The endpoint.
        endpoint: String,
    },
    /// An endpoint that is not `host:port`.
    #[error(transparent)]
    HostPort(#[from] WireError),
}
