//! How an endpoint handshake reaches a peer: the connection request (handshake type 0)
//! over the engine's handshake client, behind a trait so that tests connect in-process.

use crate::config::Config;
use crate::wire::session::HostPort;

/// Why an endpoint handshake got no reply: the handshake client's error, or a test
/// connector's own.
pub type ExchangeError = Box<dyn std::error::Error + Send + Sync>;

/// Sends a connection request (handshake type 0) to a peer's RPC address and returns
/// the reply's JSON.
pub trait Connector: Send + Sync {
    /// One request and its reply; `Err` says why there is no reply.
    fn exchange(&self, peer: &HostPort, json: &str) -> Result<String, ExchangeError>;
}

/// The engine's handshake client.
#[derive(Debug)]
pub struct HandshakeConnector {
    config: Config,
}

impl HandshakeConnector {
    /// A connector with the engine's handshake settings and bounds.
    pub fn new(config: &Config) -> Self {
        Self {
            config: config.clone(),
        }
    }
}

impl Connector for HandshakeConnector {
    fn exchange(&self, peer: &HostPort, json: &str) -> Result<String, ExchangeError> {
        crate::metadata::handshake::request(
            peer,
            crate::wire::handshake::MessageType::Connection,
            json,
            &self.config,
        )
        .map_err(ExchangeError::from)
    }
}
