//! The console scripts' Rust side: `transfer_engine_bench`, `transfer_engine_topology_dump`,
//! `mooncake-doctor` and `mooncake_http_metadata_server` (the wheel's `mooncake._cli` calls these).

use mooncake_cli::{wants_help, Flags, UsageError};
use transfer_engine::{topology, Config};

/// `transfer_engine_topology_dump [--device_name LIST] [--sys-root DIR]`: prints the local
/// topology JSON as `get_local_topology(device_name)` returns it. As upstream's script, it
/// ignores `MC_CUSTOM_TOPO_JSON` (discovery is what it shows) and logs nothing;
/// `--sys-root` stands for `/sys` (as `MC_SYSFS_ROOT`). Returns the exit status.
pub fn topology_dump_main(args: &[String]) -> i32 {
    let (root, device_name) = match topology_dump_flags(args) {
        Ok(Some(f)) => f,
        Ok(None) => {
            println!("usage: transfer_engine_topology_dump [--device_name mlx5_0,mlx5_1] [--sys-root DIR]\n\nPrints the local topology (location -> [preferred HCAs, available HCAs]) as JSON.\nMC_TE_FILTERS narrows the HCAs as in initialize; --sys-root (or MC_SYSFS_ROOT) replaces /sys.");
            return 0;
        }
        Err(e) => {
            eprintln!("transfer_engine_topology_dump: {e}");
            return 2;
        }
    };
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
    crate::http_metadata_cli::cli_main(args)
}

/// `--sys-root` and `--device_name`, each also spelt with the other separator, as the
/// script has always accepted; `None` when help was asked for.
fn topology_dump_flags(args: &[String]) -> Result<Option<(Option<String>, String)>, UsageError> {
    if wants_help(args) {
        return Ok(None);
    }
    let (mut root, mut device_name) = (None, String::new());
    let mut flags = Flags::new(args);
    while let Some((name, inline)) = flags.next_flag()? {
        match name.as_str() {
            "sys-root" | "sys_root" => root = Some(flags.value(&name, inline)?),
            "device_name" | "device-name" => device_name = flags.value(&name, inline)?,
            _ => {
                return Err(UsageError(format!(
                    "unknown argument \"--{name}\" (try --help)"
                )))
            }
        }
    }
    Ok(Some((root, device_name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Result<Option<(Option<String>, String)>, UsageError> {
        let v: Vec<String> = std::iter::once("transfer_engine_topology_dump")
            .chain(args.iter().copied())
            .map(String::from)
            .collect();
        topology_dump_flags(&v)
    }

    #[test]
    fn topology_dump_flags_in_both_spellings() {
        assert_eq!(flags(&[]), Ok(Some((None, String::new()))));
        assert_eq!(
            flags(&["--sys_root=/x", "--device-name", "mlx5_0"]),
            Ok(Some((Some("/x".into()), "mlx5_0".into())))
        );
        assert_eq!(flags(&["--bogus", "-h"]), Ok(None));
        let e = flags(&["--bogus"]).unwrap_err();
        assert!(e.0.contains("unknown argument \"--bogus\""), "{e}");
        assert!(flags(&["--sys-root"])
            .unwrap_err()
            .0
            .contains("needs a value"));
    }
}
