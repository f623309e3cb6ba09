//! `mooncake_master`: the command line to a serving master. Starts the HTTP metadata
//! server (`--enable_http_metadata_server`) and the metrics port at once; with
//! `--enable_ha`, campaigns on etcd and serves RPC only while it leads (a master that
//! loses the lead exits with status 3, for its supervisor to restart it as a standby).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::service::interceptor::InterceptedService;

use transfer_engine::metadata::http_server::{HttpMetadataServer, ServerOptions};

use super::flags::{self, Command, MasterFlags};
use super::http::AdminServer;
use super::incoming;
use super::service::{MasterService, Role, Shared};
use super::state::State;
use crate::ha;
use crate::rpc::{MasterServer, MAX_MESSAGE_BYTES, VERSION};

/// How long a leader's etcd lease lasts: a dead leader's standby takes over after this.
const HA_LEASE_TTL: Duration = Duration::from_secs(5);

/// RPC threads unless `--rpc_thread_num` says. One: the state sits behind one lock
/// anyway, and a call that never changes threads is the cheapest (on 16 CPUs, a 32 KiB x
/// 32 put at p50 448 µs against 595 with two workers; docs/benchmarks.md).
const DEFAULT_RPC_THREADS: usize = 1;

/// Exit statuses.
const EXIT_USAGE: i32 = 2;
const EXIT_FAILED: i32 = 1;
const EXIT_LOST_LEAD: i32 = 3;

/// Runs the master with `args` (without the program name); returns the exit status.
pub fn main(args: &[String]) -> i32 {
    let flags = match flags::parse(args) {
        Ok(Command::Run(f)) => f,
        Ok(Command::Help(text)) => {
            print!("{text}");
            return 0;
        }
        Ok(Command::Version) => {
            println!("mooncake_master (mooncake-rs store) {VERSION}");
            return 0;
        }
        Err(e) => {
            eprintln!("mooncake_master: {e}");
            return EXIT_USAGE;
        }
    };
    let rt = match runtime(flags.rpc_thread_num) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mooncake_master: cannot start the RPC runtime: {e}");
            return EXIT_FAILED;
        }
    };
    match rt.block_on(serve(flags)) {
        Ok(()) => 0,
        Err(Stop::LostLead(why)) => {
            eprintln!("mooncake_master: lost the lead ({why}); exiting so that a supervisor restarts this master as a standby");
            EXIT_LOST_LEAD
        }
        Err(Stop::Failed(why)) => {
            eprintln!("mooncake_master: {why}");
            EXIT_FAILED
        }
    }
}

/// The RPC runtime of `--rpc_thread_num` threads. One thread is a current-thread
/// runtime: a call is read, served and answered on the thread its bytes woke, with no
/// hand-off between workers (the fewest wake-ups per call).
fn runtime(threads: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    match threads.unwrap_or(DEFAULT_RPC_THREADS).clamp(1, 64) {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .thread_name("master-rpc")
            .enable_all()
            .build(),
    }
}

enum Stop {
    LostLead(String),
    Failed(String),
}

fn socket_addr(host: &str, port: u16, what: &str) -> Result<SocketAddr, Stop> {
    let host = host.trim_matches(['[', ']']);
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            Stop::Failed(format!(
                "{what} {host:?} is neither an IP address nor a name this host resolves"
            ))
        })
}

async fn serve(flags: MasterFlags) -> Result<(), Stop> {
    let shared = Shared::new(State::new(flags.policy.clone()));
    let _metadata = if flags.enable_http_metadata_server {
        let addr = socket_addr(
            &flags.http_metadata_server_host,
            flags.http_metadata_server_port,
            "--http_metadata_server_host",
        )?;
        let server = HttpMetadataServer::start(addr, ServerOptions::default()).map_err(|e| {
            Stop::Failed(format!(
                "cannot serve the HTTP metadata store on {addr}: {e} (--http_metadata_server_port)"
            ))
        })?;
        println!("mooncake_master: HTTP metadata server at {}", server.url());
        Some(server)
    } else {
        None
    };
    let metrics_addr = socket_addr(&flags.metrics_host, flags.metrics_port, "--metrics_host")?;
    let admin = AdminServer::start(metrics_addr, Arc::clone(&shared)).map_err(|e| {
        Stop::Failed(format!(
            "cannot serve metrics on {metrics_addr}: {e} (--metrics_port)"
        ))
    })?;
    println!(
        "mooncake_master: metrics at http://{}/metrics",
        admin.addr()
    );

    let rpc_addr = socket_addr(&flags.rpc_address, flags.rpc_port, "--rpc_address")?;
    let leadership = if flags.enable_ha {
        let me = format!("{}:{}", flags.rpc_address, flags.rpc_port);
        println!(
            "mooncake_master: standby, campaigning on etcd {:?} for cluster {:?}",
            flags.etcd_endpoints, flags.cluster_id
        );
        shared.set_role(Role::Standby { leader: None });
        let seen = Arc::clone(&shared);
        let lead = ha::campaign_observing(
            &flags.etcd_endpoints,
            &flags.cluster_id,
            &me,
            HA_LEASE_TTL,
            move |leader| {
                seen.set_role(Role::Standby {
                    leader: Some(leader.to_string()),
                })
            },
        )
        .await
        .map_err(|e| Stop::Failed(e.to_string()))?;
        shared.set_role(Role::Leader {
            address: me.clone(),
            fence: lead.fence(),
        });
        println!(
            "mooncake_master: elected leader of cluster {:?} as {me}",
            flags.cluster_id
        );
        Some(lead)
    } else {
        None
    };

    let listener = tokio::net::TcpListener::bind(rpc_addr).await.map_err(|e| {
        Stop::Failed(format!(
            "cannot listen for RPC on {rpc_addr}: {e} (--rpc_port)"
        ))
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| Stop::Failed(e.to_string()))?;
    println!("mooncake_master: serving RPC on {bound} (mooncake-rs store {VERSION})");

    let sweeper = {
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            loop {
                let next = shared.sweep(Instant::now());
                tokio::time::sleep(next).await;
            }
        })
    };
    let service = MasterServer::new(MasterService::new(Arc::clone(&shared)))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    // A leader that lost its lease answers nothing more, even a request that waited while
    // the process was frozen (it runs before the timer that reports the loss).
    let gate = Arc::clone(&shared);
    let service = InterceptedService::new(service, move |req: tonic::Request<()>| {
        gate.serving()
            .map(|()| req)
            .map_err(tonic::Status::unavailable)
    });
    let server = tonic::transport::Server::builder()
        .concurrency_limit_per_connection(256)
        .max_concurrent_streams(256)
        .timeout(Duration::from_secs(30))
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(5)))
        .tcp_nodelay(true)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming::capped(listener), shutdown_signal());
    let result = match leadership {
        Some(lead) => {
            tokio::select! {
                r = server => r.map_err(|e| Stop::Failed(format!("RPC server failed: {e}"))),
                () = lead.lost() => Err(Stop::LostLead("the etcd lease was not renewed in time".into())),
            }
        }
        None => server
            .await
            .map_err(|e| Stop::Failed(format!("RPC server failed: {e}"))),
    };
    sweeper.abort();
    result
}

/// SIGINT or SIGTERM: stop serving.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => std::future::pending::<()>().await,
    }
    println!("mooncake_master: stopping");
}
