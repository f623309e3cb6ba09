//! `netns-peer`: one engine on one host of `e2e::netns` (started inside its namespace by
//! `netns_*.rs`), both a target and an initiator. It registers `NETNS_SIZE` bytes, the
//! first `NETNS_FILL` (default: all) holding `pattern(NETNS_SEED)`, with the metadata
//! store `NETNS_METADATA` (default `P2PHANDSHAKE`), prints `{"session", "buffer", "size"}`, then runs each stdin line
//! `TAG COMMAND ARGS...` on a thread of its own and prints one JSON line tagged `TAG` when
//! it is done:
//!
//! - `read SESSION REMOTE_BUF REMOTE_OFF LOCAL_OFF LEN SEED [COUNT]`: COUNT (default 1)
//!   reads of the range, the last one's bytes checked against `pattern(SEED)` at
//!   `REMOTE_OFF`; replies `ok`, `error`, `ms` (all of them), `verified`.
//! - `write SESSION REMOTE_BUF OFF LEN`: writes its own bytes at `OFF` to the same offset.
//! - `check OFF LEN SEED`: whether its buffer holds `pattern(SEED)` there.
//! - `snapshot`: keeps a copy of its whole buffer; `unchanged`: whether it still matches.

#![allow(dead_code, reason = "its parent tests include it for a part")]

use std::io::BufRead;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use e2e::{fill_pattern_at, first_mismatch, Buf};
use serde_json::{json, Value};
use transfer_engine::{Config, OpCode, Request, TransferEngine};

fn env_u64(name: &str) -> u64 {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set"))
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The role's body.
pub fn netns_peer() {
    e2e::init_logging();
    let host = std::env::var("NETNS_HOST").expect("NETNS_HOST");
    let size = env_u64("NETNS_SIZE");
    let buf = Buf::new(size as usize);
    let fill = std::env::var("NETNS_FILL").map_or(size, |_| env_u64("NETNS_FILL"));
    fill_pattern_at(&buf, 0, fill.min(size), env_u64("NETNS_SEED"), 0);
    let metadata = std::env::var("NETNS_METADATA").unwrap_or_else(|_| "P2PHANDSHAKE".into());
    let e = TransferEngine::new(&host, &metadata, Config::from_env().unwrap())
        .unwrap_or_else(|err| panic!("engine on {host}: {err}"));
    e.register_memory(buf.addr(), size, "cpu:0").unwrap();
    let out = Arc::new(Mutex::new(std::io::stdout()));
    say(
        &out,
        &json!({"session": e.session_id(), "buffer": buf.addr(), "size": size}),
    );
    let peer = Arc::new((e, buf, Mutex::new(Vec::new())));
    std::thread::scope(|s| {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            let words: Vec<String> = line.split_whitespace().map(String::from).collect();
            if words.len() < 2 {
                continue;
            }
            let (peer, out) = (peer.clone(), out.clone());
            s.spawn(move || {
                let mut reply = run(&peer.0, &peer.1, &peer.2, &words[1..]);
                reply["tag"] = json!(words[0]);
                say(&out, &reply);
            });
        }
    });
}

fn say(out: &Mutex<std::io::Stdout>, v: &Value) {
    use std::io::Write;
    let mut o = out
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _ = writeln!(o, "{v}");
    let _ = o.flush();
}

fn num(words: &[String], i: usize) -> u64 {
    words
        .get(i)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("argument {i} of {words:?} is not a number"))
}

fn run(e: &TransferEngine, buf: &Buf, kept: &Mutex<Vec<u8>>, w: &[String]) -> Value {
    match w[0].as_str() {
        "read" | "write" => transfer(e, buf, w),
        "check" => {
            let (off, len, seed) = (num(w, 1), num(w, 2), num(w, 3));
            let bytes = buf.read_at(off as usize, len as usize).unwrap();
            json!({"ok": first_mismatch(&bytes, seed, off).is_none()})
        }
        "snapshot" => {
            *kept.lock().unwrap() = buf.to_vec();
            json!({"ok": true})
        }
        "unchanged" => json!({"ok": *kept.lock().unwrap() == buf.to_vec()}),
        other => json!({"ok": false, "error": format!("no command {other:?}")}),
    }
}

fn transfer(e: &TransferEngine, buf: &Buf, w: &[String]) -> Value {
    let session = &w[1];
    let remote = num(w, 2);
    let (op, remote_off, local_off, len) = if w[0] == "read" {
        (OpCode::Read, num(w, 3), num(w, 4), num(w, 5))
    } else {
        (OpCode::Write, num(w, 3), num(w, 3), num(w, 4))
    };
    assert!(local_off + len <= buf.len() as u64, "local range outside");
    let count = if w[0] == "read" && w.len() > 7 {
        num(w, 7)
    } else {
        1
    };
    let req = Request::new(op, buf.addr() + local_off, remote + remote_off, len);
    let started = Instant::now();
    for _ in 0..count {
        // SAFETY: the buffer lives as long as the engine (the role's end), beyond the call.
        if let Err(err) = unsafe { e.transfer_sync(session, &[req]) } {
            let ms = started.elapsed().as_secs_f64() * 1e3;
            return json!({"ok": false, "error": err.to_string(), "ms": ms});
        }
    }
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let verified = op != OpCode::Read || {
        let bytes = buf.read_at(local_off as usize, len as usize).unwrap();
        first_mismatch(&bytes, num(w, 6), remote_off).is_none()
    };
    json!({"ok": true, "ms": ms, "verified": verified})
}

/// `netns-http-metadata`: our HTTP metadata server on `NETNS_LISTEN` (`address:port`);
/// prints `{"url"}` and serves until its stdin closes.
pub fn netns_http_metadata() {
    use transfer_engine::metadata::http_server::{HttpMetadataServer, ServerOptions};
    e2e::init_logging();
    let addr = std::env::var("NETNS_LISTEN").expect("NETNS_LISTEN");
    let server = HttpMetadataServer::start(addr.parse().unwrap(), ServerOptions::default())
        .unwrap_or_else(|e| panic!("metadata server on {addr}: {e}"));
    say(
        &Mutex::new(std::io::stdout()),
        &json!({"url": server.url()}),
    );
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
    }
    drop(server);
}

/// `netns-gpu-peer`: an engine whose `NETNS_SIZE` bytes are device memory of the (FAKE)
/// GPU runtime named by `MC_CUDART_PATH`, holding `pattern(NETNS_SEED)`. Prints
/// `{"session", "buffer"}`, then answers stdin lines: `write SESSION REMOTE_BUF` (its whole
/// buffer to the peer's) and `check SEED` (its buffer holds `pattern(SEED)`); each reply
/// carries `ipc_opened`, the IPC handles its engine has opened so far (from the IPC
/// transport's decision line; -1 when it runs none).
pub fn netns_gpu_peer() {
    use std::io::Write;
    e2e::init_logging();
    let host = std::env::var("NETNS_HOST").expect("NETNS_HOST");
    let size = env_u64("NETNS_SIZE") as usize;
    let mut data = vec![0u8; size];
    e2e::fill_pattern(&mut data, env_u64("NETNS_SEED"), 0);
    let rt = transfer_engine::device::runtime().unwrap();
    rt.set_device(0).unwrap();
    let dev = rt.malloc(size).unwrap();
    // SAFETY: `dev` is a live device allocation of `size` bytes, `data` a host one.
    unsafe { rt.copy(dev as *mut u8, data.as_ptr(), size) }.unwrap();
    let e = TransferEngine::new(&host, "P2PHANDSHAKE", Config::from_env().unwrap())
        .unwrap_or_else(|err| panic!("engine on {host}: {err}"));
    e.register_memory(dev, size as u64, "cuda:0").unwrap();
    let out = Mutex::new(std::io::stdout());
    say(&out, &json!({"session": e.session_id(), "buffer": dev}));
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let w: Vec<String> = line.split_whitespace().map(String::from).collect();
        let mut reply = match w.get(1).map(String::as_str) {
            Some("write") => {
                let req = Request::new(OpCode::Write, dev, num(&w, 3), size as u64);
                // SAFETY: the device buffer lives until the role ends, beyond the call.
                match unsafe { e.transfer_sync(&w[2], &[req]) } {
                    Ok(()) => json!({"ok": true}),
                    Err(err) => json!({"ok": false, "error": err.to_string()}),
                }
            }
            Some("check") => {
                let mut back = vec![0u8; size];
                // SAFETY: as above, both of `size` bytes.
                unsafe { rt.copy(back.as_mut_ptr(), dev as *const u8, size) }.unwrap();
                json!({"ok": first_mismatch(&back, num(&w, 2), 0).is_none()})
            }
            _ => json!({"ok": false, "error": format!("no command in {line:?}")}),
        };
        reply["tag"] = json!(w.first());
        reply["ipc_opened"] = json!(ipc_opened(&e));
        say(&out, &reply);
    }
    let _ = out.lock().map(|mut o| o.flush());
}

/// The handles the IPC transport opened (its decision line's `N peer handle(s) opened`); -1
/// without an IPC transport, -2 when the line says no count.
fn ipc_opened(e: &TransferEngine) -> i64 {
    let Some((_, line)) = e
        .transport_decisions()
        .into_iter()
        .find(|(p, _)| *p == "nvlink_intra")
    else {
        return -1;
    };
    line.find(" peer handle(s) opened")
        .and_then(|i| line[..i].rsplit(' ').next()?.parse().ok())
        .unwrap_or(-2)
}
