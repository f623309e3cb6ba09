//! The console scripts' Rust side: `transfer_engine_bench`, `transfer_engine_topology_dump`
//! and `mooncake_http_metadata_server` (the wheel's `mooncake._cli` calls these).

use std::path::Path;

use transfer_engine::topology;

/// `transfer_engine_topology_dump [--sys-root DIR]`: prints the local topology JSON, as
/// `get_local_topology()` returns it. Returns the exit status.
pub fn topology_dump_main(args: &[String]) -> i32 {
    let mut root = "/".to_string();
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "-h" | "--help" => {
                println!("usage: transfer_engine_topology_dump [--sys-root DIR]\n\nPrints the local topology (location -> [preferred HCAs, available HCAs]) as JSON.");
                return 0;
            }
            "--sys-root" | "--sys_root" => match it.next() {
                Some(v) => root = v.clone(),
                None => {
                    eprintln!("transfer_engine_topology_dump: --sys-root needs a directory");
                    return 2;
                }
            },
            other => {
                match other
                    .strip_prefix("--sys-root=")
                    .or_else(|| other.strip_prefix("--sys_root="))
                {
                    Some(v) => root = v.to_string(),
                    None => {
                        eprintln!("transfer_engine_topology_dump: unknown argument {other:?} (try --help)");
                        return 2;
                    }
                }
            }
        }
    }
    println!(
        "{}",
        if root == "/" {
            // The real host: NUMA nodes and the GPUs of the loaded runtime.
            topology::to_json(&topology::local())
        } else {
            topology::to_json(&topology::discover(Path::new(&root)))
        }
    );
    0
}

/// `transfer_engine_bench ...`: the engine's benchmark, upstream's flags.
pub fn bench_main(args: &[String]) -> i32 {
    transfer_engine_bench::main_with_args(args.iter().cloned())
}

/// `mooncake_http_metadata_server [--host H] [--port P] ...`: the HTTP metadata server
/// (upstream's routes and status codes, plus liveness checks); serves until killed.
pub fn http_metadata_server_main(args: &[String]) -> i32 {
    transfer_engine::metadata::http_server::cli_main(args)
}
