//! Metadata store benchmark: `initialize` time and descriptor lookups per second.
//!
//! ```sh
//! cargo run --release -p transfer-engine --example metadata_bench -- p2p
//! cargo run --release -p transfer-engine --example metadata_bench -- http          # our server, in-process
//! cargo run --release -p transfer-engine --example metadata_bench -- http://h:8080/metadata
//! scripts/etcd-local.sh sh -c 'cargo run --release -p transfer-engine --example metadata_bench -- "$MC_METADATA_SERVER"'
//! ```
//!
//! One engine registers 16 buffers; `initialize` is timed over 20 fresh engines (each joins
//! and publishes its descriptor); then one client engine drops its cached descriptor and
//! looks it up again in a loop for 3 s, from one thread.

use std::error::Error;
use std::time::{Duration, Instant};

use transfer_engine::metadata::http_server::{HttpMetadataServer, ServerOptions};
use transfer_engine::{Config, HostBuffer, TransferEngine};

fn main() -> Result<(), Box<dyn Error>> {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "http".into());
    let mut _server = None;
    let conn = match arg.as_str() {
        "p2p" => "P2PHANDSHAKE".to_string(),
        "http" => {
            let s = HttpMetadataServer::start("127.0.0.1:0".parse()?, ServerOptions::default())?;
            let url = s.url();
            _server = Some(s);
            url
        }
        other => other.to_string(),
    };
    let mut n = 0u32;
    let mut next_name = || {
        n += 1;
        format!("127.0.0.1:{}", 50000 + n)
    };

    let mut init = Vec::new();
    for _ in 0..20 {
        let name = next_name();
        let t = Instant::now();
        let e = TransferEngine::new(&name, &conn, Config::default())?;
        init.push(t.elapsed());
        drop(e);
    }
    init.sort();

    let target = TransferEngine::new(&next_name(), &conn, Config::default())?;
    let bufs: Vec<HostBuffer> = (0..16).map(|_| HostBuffer::new(4096)).collect();
    for b in &bufs {
        target.register_memory(b.addr(), 4096, "cpu:0")?;
    }
    let client = TransferEngine::new(&next_name(), &conn, Config::default())?;
    let segment = target.session_id().to_string();
    let mut lookups = 0u64;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        client.forget_segment(&segment);
        let found = client.segment_buffers(&segment)?;
        if found.len() != bufs.len() {
            return Err(format!("lookup found {} buffers, not {}", found.len(), bufs.len()).into());
        }
        lookups += 1;
    }
    let per_s = lookups as f64 / t.elapsed().as_secs_f64();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{{\"store\":{:?},\"init_ms_p50\":{:.2},\"init_ms_max\":{:.2},\"lookups_per_s\":{:.0}}}",
        arg,
        ms(init[init.len() / 2]),
        ms(init[init.len() - 1]),
        per_s
    );
    Ok(())
}
