//! The console scripts' Rust side: `transfer_engine_bench`, `transfer_engine_topology_dump`,
//! `mooncake-doctor` and `mooncake_http_metadata_server` (the wheel's `mooncake._cli` calls these).

use transfer_engine::{topology, Config};

/// `transfer_engine_topology_dump [--device_name LIST] [--sys-root DIR]`: prints the local
/// topology JSON as `get_local_topology(device_name)` returns it. As upstream's script, it
/// ignores `MC_CUSTOM_TOPO_JSON` (discovery is what it shows) and logs nothing;
/// `--sys-root` stands for `/sys` (as `MC_SYSFS_ROOT`). Returns the exit status.
pub fn topology_dump_main(args: &[String]) -> i32 {
    let mut root: Option<String> = None;
    let mut device_name = String::new();
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        match flag {
            "-h" | "--help" => {
                println!("usage: transfer_engine_topology_dump [--device_name mlx5_0,mlx5_1] [--sys-root DIR]\n\nPrints the local topology (location -> [preferred HCAs, available HCAs]) as JSON.\nMC_TE_FILTERS narrows the HCAs as in initialize; --sys-root (or MC_SYSFS_ROOT) replaces /sys.");
                return 0;
            }
            "--sys-root" | "--sys_root" | "--device_name" | "--device-name" => {
                let Some(value) = inline.or_else(|| it.next().cloned()) else {
                    eprintln!("transfer_engine_topology_dump: {flag} needs a value");
                    return 2;
                };
                if flag.starts_with("--sys") {
                    root = Some(value);
                } else {
                    device_name = value;
                }
            }
            other => {
                eprintln!("transfer_engine_topology_dump: unknown argument {other:?} (try --help)");
                return 2;
            }
        }
    }
    let mut config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("transfer_engine_topology_dump: {e}");
            return 1;
        }
    };
    config.custom_topo_json = None;
    if let Some(r) = root {
        config.sysfs_root = r.into();
    }
    match topology::local(&config, &device_name) {
        Ok(found) => {
            println!("{}", topology::to_json(&found.matrix));
            0
        }
        Err(e) => {
            eprintln!("transfer_engine_topology_dump: {e}");
            1
        }
    }
}

/// `transfer_engine_bench ...`: the engine's benchmark, upstream's flags.
pub fn bench_main(args: &[String]) -> i32 {
    transfer_engine_bench::main_with_args(args.iter().cloned())
}

/// `mooncake-doctor ...`: checks this host; `facts` are the Python side's (JSON).
pub fn doctor_main(args: &[String], facts: Option<&str>) -> i32 {
    transfer_engine_doctor::main_with_args(args, facts)
}

/// `mooncake_http_metadata_server [--host H] [--port P] ...`: the HTTP metadata server
/// (upstream's routes and status codes, plus liveness checks); serves until killed.
pub fn http_metadata_server_main(args: &[String]) -> i32 {
    transfer_engine::metadata::http_server::cli_main(args)
}
