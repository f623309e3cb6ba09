//! The HTTP metadata store: upstream's protocol over a blocking HTTP client (`ureq`).
//!
//! `GET`/`PUT`/`DELETE <url>?key=<key>`; PUT bodies are compact JSON with
//! `Content-Type: application/json`; only status 200 is success (upstream's libcurl
//! plugin). Timeouts are upstream's: 1.5 s to connect, 3 s for a whole request.
//!
//! Joining (`HttpStore::join`) writes this engine's `rpc_meta` key. A server that refuses
//! to overwrite an existing `rpc_meta` key (upstream's Python server answers 400) left by
//! an engine that died is handled here: the old entry's engine is probed over its
//! handshake port, and an entry whose engine does not answer (or that is this engine's
//! own address) is deleted and written again. The key is then read back, so a store that
//! answers garbage fails `initialize` with the reason.

use std::time::Duration;

use super::store_failure::HttpAnswer;
use super::{
    check_old_owner, local_engine_joined, local_engine_left, stored_desc, KeySpace, MetadataError,
    MetadataStore, RpcMeta, StoreFailure,
};
use crate::config::Config;
use crate::wire::descriptor::SegmentDesc;
use crate::wire::session::{HostPort, SegmentId};

/// Largest body read from the store (a descriptor of many buffers is large; upstream's
/// etcd client allows 32 MiB messages).
pub const MAX_VALUE_BYTES: u64 = 32 << 20;
/// Upstream's connect timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);
/// Upstream's whole-request timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_millis(3000);

/// One engine's view of an HTTP metadata server.
pub struct HttpStore {
    agent: ureq::Agent,
    url: String,
    keys: KeySpace,
    /// This engine's segment name and `rpc_meta` value, once joined.
    joined: parking_lot::Mutex<Option<(String, RpcMeta)>>,
    config: Config,
}

/// A response: status and body text (bounded).
struct Reply {
    status: u16,
    body: String,
}

impl Reply {
    /// This answer to `method` of `key`, for an error.
    fn answer(&self, method: &'static str, key: &str) -> HttpAnswer {
        HttpAnswer {
            method,
            key: key.to_string(),
            status: self.status,
            body: excerpt(&self.body),
        }
    }
}

impl HttpStore {
    /// A store at `url` (`http://host:port/path`) for the keys of `cluster_id`. No request
    /// is made yet.
    pub fn new(url: &str, cluster_id: &str, config: Config) -> Result<Self, MetadataError> {
        let bad = |cause: StoreFailure| MetadataError::Store {
            store: url.to_string(),
            cause,
        };
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad(StoreFailure::NotHttp))?;
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        if authority.is_empty() {
            return Err(bad(StoreFailure::NoHost));
        }
        if url.contains('?') || url.contains('#') {
            return Err(bad(StoreFailure::QueryOrFragment));
        }
        // Validate the way the client will parse it.
        ureq::http::Uri::try_from(url).map_err(|e| bad(StoreFailure::BadUrl(e)))?;
        let agent = ureq::Agent::config_builder()
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_global(Some(REQUEST_TIMEOUT))
            .http_status_as_error(false)
            .max_redirects(0)
            .build()
            .into();
        Ok(Self {
            agent,
            url: url.to_string(),
            keys: KeySpace::new(cluster_id),
            joined: parking_lot::Mutex::new(None),
            config,
        })
    }

    /// Writes `rpc_meta` for segment `name` (replacing the entry of a dead engine of the
    /// same name), reads it back to check the store, and remembers `name` for `leave`.
    fn join_as(&self, name: &str, rpc: &RpcMeta) -> Result<(), MetadataError> {
        let key = self.keys.rpc_meta(name);
        let body = rpc.encode();
        let put = self.put(&key, &body)?;
        if put.status != 200 {
            self.replace_stale_owner(name, &key, rpc, &put)?;
        }
        let back = self.get(&key)?;
        if back.status != 200 {
            return Err(self.err(StoreFailure::ReadBackStatus {
                key,
                status: back.status,
                body: excerpt(&back.body),
            }));
        }
        match RpcMeta::decode(&back.body) {
            Ok(m) if &m == rpc => {}
            Ok(found) => {
                return Err(self.err(StoreFailure::TakenOver {
                    key,
                    found: Box::new(found),
                    ours: Box::new(rpc.clone()),
                    name: name.to_string(),
                }))
            }
            Err(source) => {
                return Err(self.err(StoreFailure::ReadBackGarbage {
                    key,
                    source,
                    body: excerpt(&back.body),
                }))
            }
        }
        *self.joined.lock() = Some((name.to_string(), rpc.clone()));
        local_engine_joined(rpc);
        Ok(())
    }

    /// The first PUT of `key` was refused: if the existing entry belongs to an engine that
    /// is gone (or is ours), delete it and write ours.
    fn replace_stale_owner(
        &self,
        name: &str,
        key: &str,
        rpc: &RpcMeta,
        refused: &Reply,
    ) -> Result<(), MetadataError> {
        let refused = refused.answer("PUT", key);
        let old = self.get(key)?;
        if old.status != 200 {
            return Err(self.err(StoreFailure::Status(refused)));
        }
        let old = match RpcMeta::decode(&old.body) {
            Ok(old) => old,
            Err(source) => {
                return Err(self.err(StoreFailure::StaleEntryGarbage {
                    refused: Box::new(refused),
                    source,
                }));
            }
        };
        check_old_owner(&self.url, name, &old, rpc, &self.config)?;
        let del = self.delete(key)?;
        if del.status != 200 && del.status != 404 {
            return Err(self.err(StoreFailure::StaleEntryKept {
                refused,
                status: del.status,
            }));
        }
        self.put_ok(key, &rpc.encode())
    }

    /// PUT, and only 200 is success.
    fn put_ok(&self, key: &str, json: &str) -> Result<(), MetadataError> {
        let reply = self.put(key, json)?;
        if reply.status != 200 {
            return Err(self.err(StoreFailure::Status(reply.answer("PUT", key))));
        }
        Ok(())
    }

    fn err(&self, cause: StoreFailure) -> MetadataError {
        MetadataError::Store {
            store: self.url.clone(),
            cause,
        }
    }

    fn finish(
        &self,
        method: &'static str,
        key: &str,
        res: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Reply, MetadataError> {
        let mut resp = res.map_err(|source| {
            self.err(StoreFailure::Request {
                method,
                key: key.to_string(),
                source,
            })
        })?;
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_VALUE_BYTES)
            .read_to_string()
            .map_err(|source| {
                self.err(StoreFailure::ReadReply {
                    method,
                    key: key.to_string(),
                    source,
                })
            })?;
        Ok(Reply { status, body })
    }

    fn get(&self, key: &str) -> Result<Reply, MetadataError> {
        let res = self.agent.get(&self.url).query("key", key).call();
        self.finish("GET", key, res)
    }

    fn put(&self, key: &str, json: &str) -> Result<Reply, MetadataError> {
        let res = self
            .agent
            .put(&self.url)
            .query("key", key)
            .header("Content-Type", "application/json")
            .send(json);
        self.finish("PUT", key, res)
    }

    fn delete(&self, key: &str) -> Result<Reply, MetadataError> {
        let res = self.agent.delete(&self.url).query("key", key).call();
        self.finish("DELETE", key, res)
    }

    fn get_known(&self, key: &str, segment: &str) -> Result<String, MetadataError> {
        let reply = self.get(key)?;
        match reply.status {
            200 => Ok(reply.body),
            404 => Err(MetadataError::UnknownSegment {
                segment: segment.to_string(),
                store: self.url.clone(),
            }),
            _ => Err(self.err(StoreFailure::Status(reply.answer("GET", key)))),
        }
    }
}

impl MetadataStore for HttpStore {
    fn fetch(&self, id: &SegmentId) -> Result<SegmentDesc, MetadataError> {
        let body = self.get_known(&self.keys.ram(id.name()), id.name())?;
        stored_desc(id, &body, || self.rpc_address(id).ok())
    }

    fn publish(&self, desc: &SegmentDesc) -> Result<(), MetadataError> {
        self.put_ok(&self.keys.ram(&desc.name), &desc.encode())
    }

    fn rpc_address(&self, id: &SegmentId) -> Result<HostPort, MetadataError> {
        let key = self.keys.rpc_meta(id.name());
        let body = self.get_known(&key, id.name())?;
        RpcMeta::decode(&body)
            .map(|m| m.host_port())
            .map_err(|source| self.err(StoreFailure::UnusableValue { key, source }))
    }

    fn join(&self, name: &str, rpc: &RpcMeta) -> Result<(), MetadataError> {
        self.join_as(name, rpc)
    }

    fn leave(&self) {
        let Some((name, ours)) = self.joined.lock().take() else {
            return;
        };
        local_engine_left(&ours);
        // Only our own entries: another engine may have taken the name since (after a
        // probe found this one unresponsive).
        let rpc_key = self.keys.rpc_meta(&name);
        match self.get(&rpc_key) {
            Ok(r) if r.status == 200 && RpcMeta::decode(&r.body).is_ok_and(|m| m == ours) => {}
            Ok(r) if r.status == 404 => return,
            Ok(_) => {
                tracing::info!(
                    "metadata store {}: {rpc_key} belongs to another engine now; left alone",
                    self.url
                );
                return;
            }
            Err(e) => {
                tracing::warn!("{e}");
                return;
            }
        }
        for key in [self.keys.ram(&name), rpc_key] {
            match self.delete(&key) {
                Ok(r) if r.status == 200 || r.status == 404 => {}
                Ok(r) => tracing::warn!(
                    "metadata store {}: DELETE {key} answered {}",
                    self.url,
                    r.status
                ),
                Err(e) => tracing::warn!("{e}"),
            }
        }
    }
}

/// The start of a body, for error messages.
fn excerpt(body: &str) -> String {
    const MAX: usize = 120;
    let mut end = body.len().min(MAX);
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    let cut = body.get(..end).unwrap_or_default();
    if end < body.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}
