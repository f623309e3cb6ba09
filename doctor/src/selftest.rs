//! `selftest`: two engines of this process on loopback, started with the protocol the
//! decision takes; one writes a pattern into the other's buffer and reads it back, bytes
//! compared, within the run's time budget.

use std::time::Instant;

use serde_json::json;
use transfer_engine::{
    Config, HostBuffer, OpCode, Request, TransferEngine, TransportRequest, P2P_HANDSHAKE,
};

use crate::host::Inputs;
use crate::report::Check;

/// Bytes moved each way.
pub const SELFTEST_BYTES: usize = 32 << 20;

/// The selftest check.
pub fn check(inp: &Inputs, config: &Config) -> Check {
    match run(inp, config) {
        Ok((saw, data)) => Check::ok("selftest", saw).with_data(data),
        Err(why) => Check::fail(
            "selftest",
            why,
            "the checks above say what is missing; MC_FORCE_TCP=1 tells an RDMA problem from a host one; MC_LOG_LEVEL=DEBUG shows the engine's steps",
        ),
    }
}

fn run(inp: &Inputs, config: &Config) -> Result<(String, serde_json::Value), String> {
    let started = Instant::now();
    let deadline = started + inp.budget;
    let request = TransportRequest::new(&inp.protocol, &inp.device_name);
    let open = |role: &str| {
        TransferEngine::with_transports("127.0.0.1", P2P_HANDSHAKE, config.clone(), &request)
            .map_err(|e| format!("starting the {role} engine failed: {e}"))
    };
    let initiator = open("initiator")?;
    let target = open("target")?;
    let len = SELFTEST_BYTES;
    let (src, dst, back) = (
        HostBuffer::try_new(len),
        HostBuffer::try_new(len),
        HostBuffer::try_new(len),
    );
    let (Some(src), Some(dst), Some(back)) = (src, dst, back) else {
        return Err(format!("cannot allocate 3 x {len} bytes"));
    };
    let pattern: Vec<u8> = (0..len).map(|i| (i * 131 + (i >> 12)) as u8).collect();
    src.write_at(0, &pattern).map_err(|e| e.to_string())?;
    dst.fill(0);
    back.fill(0);
    for (engine, buf) in [(&initiator, &src), (&initiator, &back), (&target, &dst)] {
        engine
            .register_memory(buf.addr(), len as u64, "cpu:0")
            .map_err(|e| format!("register_memory failed: {e}"))?;
    }
    let segment = target.session_id().to_string();
    let move_bytes = |op: OpCode, local: u64| -> Result<f64, String> {
        let t = Instant::now();
        let req = [Request::new(op, local, dst.addr(), len as u64)];
        // SAFETY: the buffers live until the end of this function, after the batch is
        // finished or drained (wait_deadline drains on a timeout).
        let batch = unsafe { initiator.submit(&segment, &req) }
            .map_err(|e| format!("{op:?} to {segment} could not start: {e}"))?;
        batch
            .wait_deadline(deadline)
            .map_err(|e| format!("{op:?} of {len} bytes to {segment}: {e}"))?;
        Ok(len as f64 / t.elapsed().as_secs_f64() / 1e9)
    };
    let write_gbps = move_bytes(OpCode::Write, src.addr())?;
    if dst.to_vec() != pattern {
        return Err(format!(
            "write to {segment} completed but the target's bytes differ from those sent"
        ));
    }
    let read_gbps = move_bytes(OpCode::Read, back.addr())?;
    if back.to_vec() != pattern {
        return Err(format!(
            "read from {segment} completed but the bytes read differ from the target's"
        ));
    }
    let protocols = target.local_descriptor().protocol;
    let saw = format!(
        "{} MiB written and read back between two engines on 127.0.0.1 over {}, bytes verified: write {write_gbps:.2} GB/s, read {read_gbps:.2} GB/s ({} ms)",
        len >> 20,
        protocols.join(" + "),
        started.elapsed().as_millis()
    );
    let data = json!({
        "bytes": len, "protocols": protocols, "write_gbps": write_gbps, "read_gbps": read_gbps,
        "verified": true, "elapsed_ms": started.elapsed().as_millis() as u64,
    });
    Ok((saw, data))
}
