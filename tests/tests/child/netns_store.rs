//! The store's roles on hosts of `e2e::netns` (started inside their namespaces by
//! `netns_store.rs`):
//!
//! - `netns-store-master`: `mooncake_master` with the flags in `NETNS_MASTER_ARGS`
//!   (whitespace-separated), until killed.
//! - `netns-store-client`: an engine on `NETNS_HOST` (P2P handshake) and a store client of
//!   the master at `NETNS_MASTER` lending `NETNS_SEGMENT` bytes; prints `{"session"}`, then
//!   runs each stdin line `TAG COMMAND ARGS...` in turn and prints one JSON line tagged
//!   `TAG`:
//!   - `put KEY LEN SEED [PREFERRED_SEGMENT]`: `pattern(SEED)` of LEN bytes under KEY;
//!     replies `ok`, `error`, `ms`.
//!   - `get KEY SEED`: the whole value; replies `ok`, `error`, `len`, `verified` (the bytes
//!     are `pattern(SEED)`).

use std::io::BufRead;
use std::sync::Arc;
use std::time::Instant;

use e2e::{first_mismatch, pattern_byte};
use mooncake_store::client::{ClientConfig, StoreClient};
use mooncake_store::master::state::PutConfig;
use serde_json::{json, Value};
use transfer_engine::{Config, TransferEngine};

/// `netns-store-master`.
pub fn netns_store_master() {
    e2e::init_logging();
    let args: Vec<String> = std::env::var("NETNS_MASTER_ARGS")
        .expect("NETNS_MASTER_ARGS")
        .split_whitespace()
        .map(String::from)
        .collect();
    std::process::exit(mooncake_store::master::run::main(&args));
}

/// `netns-store-client`.
pub fn netns_store_client() {
    e2e::init_logging();
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let host = var("NETNS_HOST");
    let engine = TransferEngine::new(&host, "P2PHANDSHAKE", Config::from_env().unwrap())
        .unwrap_or_else(|e| panic!("engine on {host}: {e}"));
    let cfg = ClientConfig {
        global_segment_size: var("NETNS_SEGMENT").parse().unwrap(),
        local_buffer_size: 8 << 20,
        master_server_addr: var("NETNS_MASTER"),
    };
    let client = StoreClient::setup(Arc::new(engine), &cfg)
        .unwrap_or_else(|e| panic!("store client on {host}: {e}"));
    println!("{}", json!({"session": client.hostname().unwrap()}));
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let w: Vec<&str> = line.split_whitespace().collect();
        let Some((tag, command)) = w.split_first() else {
            continue;
        };
        let mut reply = run(&client, command);
        reply["tag"] = json!(tag);
        println!("{reply}");
    }
}

fn num(w: &[&str], i: usize) -> u64 {
    w.get(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("argument {i} of {w:?} is not a number"))
}

fn run(client: &StoreClient, w: &[&str]) -> Value {
    let started = Instant::now();
    let ms = || started.elapsed().as_secs_f64() * 1e3;
    match w.first().copied() {
        Some("put") => {
            let (len, seed) = (num(w, 2), num(w, 3));
            let value: Vec<u8> = (0..len).map(|i| pattern_byte(i, seed)).collect();
            let cfg = PutConfig {
                replica_num: 1,
                preferred_segment: w.get(4).unwrap_or(&"").to_string(),
                with_soft_pin: false,
            };
            match client.put_parts(w[1], &[&value], &cfg) {
                Ok(()) => json!({"ok": true, "ms": ms()}),
                Err(e) => json!({"ok": false, "error": e.to_string(), "ms": ms()}),
            }
        }
        Some("get") => {
            let got = client
                .batch_get_bytes(&[w[1].to_string()])
                .and_then(|mut r| r.pop().unwrap_or_else(|| Ok(Vec::new())));
            match got {
                Ok(bytes) => json!({
                    "ok": true,
                    "len": bytes.len(),
                    "verified": first_mismatch(&bytes, num(w, 2), 0).is_none(),
                    "ms": ms(),
                }),
                Err(e) => json!({"ok": false, "error": e.to_string(), "ms": ms()}),
            }
        }
        other => json!({"ok": false, "error": format!("no command {other:?}")}),
    }
}
