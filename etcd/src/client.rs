//! The client: one balanced channel over the endpoints, and the calls on it.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::Streaming;

use crate::messages::{self as m, Request};
use crate::rpc::{
    k_v_client::KVClient as KvClient, lease_client::LeaseClient, watch_client::WatchClient,
};
use crate::Error;

/// How the channel dials and how long a call may take.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    connect_timeout: Option<Duration>,
    timeout: Option<Duration>,
}

impl ConnectOptions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = Some(d);
        self
    }

    /// The limit of each call (until etcd's answer begins, for streams).
    pub fn with_timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }
}

/// An etcd v3 client. Cloning is cheap: the clones share the channel.
#[derive(Clone)]
pub struct Client {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    watch: WatchClient<Channel>,
}

impl Client {
    /// A client balancing over `endpoints` (`http://host:port`). Nothing is dialled yet:
    /// the first call does that, and an unreachable etcd shows there.
    pub async fn connect<E: AsRef<str>>(
        endpoints: impl IntoIterator<Item = E>,
        options: Option<ConnectOptions>,
    ) -> Result<Self, Error> {
        let options = options.unwrap_or_default();
        let mut list = Vec::new();
        for e in endpoints {
            let url = e.as_ref().to_string();
            let mut ep = Endpoint::from_shared(url.clone()).map_err(|_| Error::InvalidUri(url))?;
            if let Some(d) = options.connect_timeout {
                ep = ep.connect_timeout(d);
            }
            if let Some(d) = options.timeout {
                ep = ep.timeout(d);
            }
            list.push(ep);
        }
        if list.is_empty() {
            return Err(Error::InvalidUri(String::new()));
        }
        let channel = Channel::balance_list(list.into_iter());
        Ok(Self {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            watch: WatchClient::new(channel),
        })
    }

    /// Reads one key.
    pub async fn get(
        &mut self,
        key: impl Into<Vec<u8>>,
        _options: Option<()>,
    ) -> Result<m::RangeResponse, Error> {
        let req = m::RangeRequest {
            key: key.into(),
            range_end: Vec::new(),
        };
        Ok(self.kv.range(req).await?.into_inner())
    }

    /// Writes one key.
    pub async fn put(
        &mut self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: Option<PutOptions>,
    ) -> Result<m::PutResponse, Error> {
        let req = put_request(key.into(), value.into(), options);
        Ok(self.kv.put(req).await?.into_inner())
    }

    /// Deletes one key.
    pub async fn delete(
        &mut self,
        key: impl Into<Vec<u8>>,
        _options: Option<()>,
    ) -> Result<m::DeleteRangeResponse, Error> {
        let req = m::DeleteRangeRequest {
            key: key.into(),
            range_end: Vec::new(),
        };
        Ok(self.kv.delete_range(req).await?.into_inner())
    }

    pub async fn txn(&mut self, txn: Txn) -> Result<m::TxnResponse, Error> {
        Ok(self.kv.txn(txn.0).await?.into_inner())
    }

    /// A lease of `ttl` seconds.
    pub async fn lease_grant(
        &mut self,
        ttl: i64,
        _options: Option<()>,
    ) -> Result<m::LeaseGrantResponse, Error> {
        let req = m::LeaseGrantRequest { ttl, id: 0 };
        Ok(self.lease.lease_grant(req).await?.into_inner())
    }

    /// Ends a lease, deleting every key bound to it.
    pub async fn lease_revoke(&mut self, id: i64) -> Result<m::LeaseRevokeResponse, Error> {
        let req = m::LeaseRevokeRequest { id };
        Ok(self.lease.lease_revoke(req).await?.into_inner())
    }

    /// Opens a keep-alive stream for lease `id`, renewing it once; a lease etcd no longer
    /// has is an error.
    pub async fn lease_keep_alive(
        &mut self,
        id: i64,
    ) -> Result<(LeaseKeeper, LeaseKeepAliveStream), Error> {
        let (tx, rx) = mpsc::channel(4);
        let mut keeper = LeaseKeeper { id, tx };
        keeper.keep_alive().await?;
        let mut stream = self
            .lease
            .lease_keep_alive(ReceiverStream::new(rx))
            .await?
            .into_inner();
        match stream.message().await? {
            Some(r) if r.ttl > 0 => Ok((keeper, LeaseKeepAliveStream(stream))),
            Some(_) => Err(Error::LeaseKeepAliveError(format!(
                "lease {id:x} not found"
            ))),
            None => Err(Error::LeaseKeepAliveError(
                "etcd closed the keep-alive stream".into(),
            )),
        }
    }

    /// Watches one key from `options`' start revision. The stream's first answer is
    /// etcd's confirmation that the watch exists.
    pub async fn watch(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<WatchStream, Error> {
        let (tx, rx) = mpsc::channel(1);
        let create = m::WatchCreateRequest {
            key: key.into(),
            range_end: Vec::new(),
            start_revision: options.map_or(0, |o| o.start_revision),
        };
        let req = m::WatchRequest {
            request_union: Some(m::RequestUnion::CreateRequest(create)),
        };
        tx.send(req)
            .await
            .map_err(|_| Error::WatchError("the request stream closed".into()))?;
        let stream = self
            .watch
            .watch(ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(WatchStream { _tx: tx, stream })
    }
}

fn put_request(key: Vec<u8>, value: Vec<u8>, options: Option<PutOptions>) -> m::PutRequest {
    m::PutRequest {
        key,
        value,
        lease: options.map_or(0, |o| o.lease),
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct PutOptions {
    lease: i64,
}

impl PutOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds the key to a lease: it is deleted when the lease ends.
    pub fn with_lease(mut self, lease: i64) -> Self {
        self.lease = lease;
        self
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct WatchOptions {
    start_revision: i64,
}

impl WatchOptions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_start_revision(mut self, revision: i64) -> Self {
        self.start_revision = revision;
        self
    }
}

/// Renews one lease over its keep-alive stream.
pub struct LeaseKeeper {
    id: i64,
    tx: mpsc::Sender<m::LeaseKeepAliveRequest>,
}

impl LeaseKeeper {
    /// Sends one renewal; its answer comes on the [`LeaseKeepAliveStream`].
    pub async fn keep_alive(&mut self) -> Result<(), Error> {
        self.tx
            .send(m::LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| Error::LeaseKeepAliveError("the keep-alive stream closed".into()))
    }
}

/// etcd's answers to the renewals.
pub struct LeaseKeepAliveStream(Streaming<m::LeaseKeepAliveResponse>);

impl LeaseKeepAliveStream {
    pub async fn message(&mut self) -> Result<Option<m::LeaseKeepAliveResponse>, Error> {
        Ok(self.0.message().await?)
    }
}

/// A watch's answers; dropping it ends the watch.
pub struct WatchStream {
    // etcd ends a watch when its request stream closes.
    _tx: mpsc::Sender<m::WatchRequest>,
    stream: Streaming<m::WatchResponse>,
}

impl WatchStream {
    pub async fn message(&mut self) -> Result<Option<m::WatchResponse>, Error> {
        Ok(self.stream.message().await?)
    }
}

/// `Compare`'s operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// One comparison of a transaction.
#[derive(Clone, Debug)]
pub struct Compare(m::Compare);

impl Compare {
    /// Compares the key's create revision (0: the key does not exist).
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Self {
        let result = match op {
            CompareOp::Equal => m::CompareResult::Equal,
            CompareOp::Greater => m::CompareResult::Greater,
            CompareOp::Less => m::CompareResult::Less,
            CompareOp::NotEqual => m::CompareResult::NotEqual,
        };
        Self(m::Compare {
            result: result as i32,
            target: m::CompareTarget::Create as i32,
            key: key.into(),
            target_union: Some(m::TargetUnion::CreateRevision(revision)),
        })
    }
}

/// One operation of a transaction's branch.
#[derive(Clone, Debug)]
pub struct TxnOp(m::RequestOp);

impl TxnOp {
    pub fn put(
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: Option<PutOptions>,
    ) -> Self {
        Self(m::RequestOp {
            request: Some(Request::RequestPut(put_request(
                key.into(),
                value.into(),
                options,
            ))),
        })
    }

    pub fn get(key: impl Into<Vec<u8>>, _options: Option<()>) -> Self {
        Self(m::RequestOp {
            request: Some(Request::RequestRange(m::RangeRequest {
                key: key.into(),
                range_end: Vec::new(),
            })),
        })
    }
}

/// The answer of one [`TxnOp`].
#[derive(Clone, Debug)]
pub enum TxnOpResponse {
    Get(m::RangeResponse),
    Put(m::PutResponse),
    Delete(m::DeleteRangeResponse),
}

/// A transaction: `when` the comparisons hold, `and_then`, else `or_else`.
#[derive(Clone, Debug, Default)]
pub struct Txn(m::TxnRequest);

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn when(mut self, compares: impl IntoIterator<Item = Compare>) -> Self {
        self.0.compare = compares.into_iter().map(|c| c.0).collect();
        self
    }

    pub fn and_then(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.0.success = ops.into_iter().map(|o| o.0).collect();
        self
    }

    pub fn or_else(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.0.failure = ops.into_iter().map(|o| o.0).collect();
        self
    }
}
