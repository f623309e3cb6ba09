//! A client call's failure: upstream's code (what Python callers compare) and the
//! sentence that says what went wrong and what to do (what `last_error` shows).

use std::borrow::Cow;
use std::fmt;

use crate::codes::Code;

/// Why a store call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError {
    pub code: Code,
    /// Borrowed where the text is fixed: a batch's per-key results cost no allocation.
    pub message: Cow<'static, str>,
}

impl StoreError {
    pub fn new(code: Code, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// A code from the master, with the key it concerns.
    pub fn from_code(code: Code, key: &str) -> Self {
        let what = match code {
            Code::ObjectNotFound => "no such object",
            Code::ObjectAlreadyExists => "the key exists already",
            Code::NoAvailableHandle => "no segment has room for the object, even after eviction",
            Code::ReplicaIsNotReady => "the object's put has not been committed yet",
            Code::ObjectHasLease => "a reader holds a lease on the object",
            Code::InvalidParams => "bad argument (empty key, key over 4096 bytes, or size 0)",
            _ => code.name(),
        };
        Self::new(code, format!("{key:?}: {what} ({})", code.value()))
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.message, self.code)
    }
}

impl std::error::Error for StoreError {}
