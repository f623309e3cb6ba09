//! `mooncake_http_metadata_server`'s command line; the server itself is the engine's
//! [`transfer_engine::metadata::http_server`], which has no flags of its own so that the
//! engine carries no argument parser.

use std::net::SocketAddr;
use std::time::Duration;

use mooncake_cli::{wants_help, Flags, UsageError};
use transfer_engine::metadata::http_server::{HttpMetadataServer, ServerOptions, ROUTE};

const CLI_HELP: &str = "\
Mooncake HTTP metadata server (upstream-compatible), with liveness checks.

Usage: mooncake_http_metadata_server [OPTIONS]

Options:
      --host <HOST>                    Address to listen on [default: 0.0.0.0]
      --port <PORT>                    Port to listen on [default: 8080]
      --max-body-bytes <BYTES>         Largest PUT body in bytes [default: 16777216]
      --max-keys <N>                   Most keys held [default: 100000]
      --liveness-interval-sec <SEC>    Seconds between probes of every registered engine
                                       (0: no probes; entries of dead engines then stay until
                                       a new engine of the same name replaces them)
                                       [default: 10]
      --liveness-misses <N>            Unanswered probes in a row after which an engine's
                                       entries are deleted [default: 3]
  -h, --help                           Print help
";

/// The metadata server's command line (see [`CLI_HELP`]).
#[derive(Debug, Clone, PartialEq)]
struct Cli {
    host: String,
    port: u16,
    max_body_bytes: usize,
    max_keys: usize,
    liveness_interval_sec: f64,
    liveness_misses: u32,
}

impl Cli {
    /// The flags of `args` (program name first); `None` when help was asked for.
    fn parse(args: &[String]) -> Result<Option<Self>, UsageError> {
        let mut cli = Self {
            host: "0.0.0.0".into(),
            port: 8080,
            max_body_bytes: 16 << 20,
            max_keys: 100_000,
            liveness_interval_sec: 10.0,
            liveness_misses: 3,
        };
        if wants_help(args) {
            return Ok(None);
        }
        let mut flags = Flags::new(args);
        while let Some((name, inline)) = flags.next_flag()? {
            let f = &mut flags;
            match name.as_str() {
                "host" => cli.host = f.value(&name, inline)?,
                "port" => cli.port = f.parsed(&name, inline, "a port number (0-65535)")?,
                "max-body-bytes" => cli.max_body_bytes = f.parsed(&name, inline, "a byte count")?,
                "max-keys" => cli.max_keys = f.parsed(&name, inline, "a key count")?,
                "liveness-interval-sec" => {
                    cli.liveness_interval_sec =
                        f.parsed(&name, inline, "seconds (e.g. 10 or 0.5)")?
                }
                "liveness-misses" => cli.liveness_misses = f.parsed(&name, inline, "a count")?,
                _ => return Err(UsageError::unknown(&name)),
            }
        }
        Ok(Some(cli))
    }
}

/// `mooncake_http_metadata_server [--host H] [--port P] ...`: serves until killed.
/// Returns the exit status.
pub fn cli_main(args: &[String]) -> i32 {
    let cli = match Cli::parse(args) {
        Ok(Some(c)) => c,
        Ok(None) => {
            print!("{CLI_HELP}");
            return 0;
        }
        Err(e) => {
            eprintln!("mooncake_http_metadata_server: {e}");
            return 2;
        }
    };
    let interval = match cli.liveness_interval_sec {
        0.0 => None,
        s if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
        s => {
            eprintln!("mooncake_http_metadata_server: --liveness-interval-sec {s}: must be >= 0");
            return 2;
        }
    };
    let ip = match cli
        .host
        .trim_matches(['[', ']'])
        .parse::<std::net::IpAddr>()
    {
        Ok(ip) => ip,
        Err(_) => {
            eprintln!(
                "mooncake_http_metadata_server: --host {:?} is not an IP address",
                cli.host
            );
            return 2;
        }
    };
    let opts = ServerOptions {
        max_body_bytes: cli.max_body_bytes,
        max_keys: cli.max_keys,
        liveness_interval: interval,
        liveness_misses: cli.liveness_misses,
        ..ServerOptions::default()
    };
    match HttpMetadataServer::start(SocketAddr::new(ip, cli.port), opts) {
        Ok(server) => {
            println!(
                "mooncake_http_metadata_server: serving http://{}{ROUTE}",
                server.addr()
            );
            server.wait();
            0
        }
        Err(e) => {
            eprintln!(
                "mooncake_http_metadata_server: cannot listen on {}:{}: {e}",
                cli.host, cli.port
            );
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Result<Option<Cli>, UsageError> {
        let mut v = vec!["mooncake_http_metadata_server".to_string()];
        v.extend(args.iter().map(|s| s.to_string()));
        Cli::parse(&v)
    }

    #[test]
    fn cli_defaults_and_flags() {
        let d = cli(&[]).unwrap().unwrap();
        assert_eq!(
            (d.host.as_str(), d.port, d.max_keys),
            ("0.0.0.0", 8080, 100_000)
        );
        assert_eq!((d.max_body_bytes, d.liveness_misses), (16 << 20, 3));
        assert_eq!(d.liveness_interval_sec, 10.0);
        let c = cli(&[
            "--host",
            "127.0.0.1",
            "--port=9",
            "--max-body-bytes",
            "10",
            "--max-keys=5",
            "--liveness-interval-sec",
            "0.5",
            "--liveness-misses",
            "7",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (c.host.as_str(), c.port, c.max_body_bytes, c.max_keys),
            ("127.0.0.1", 9, 10, 5)
        );
        assert_eq!((c.liveness_interval_sec, c.liveness_misses), (0.5, 7));
        assert_eq!(cli(&["--port", "1", "--help"]), Ok(None));
        assert!(CLI_HELP.contains("--liveness-interval-sec <SEC>"));
    }

    #[test]
    fn cli_errors_name_the_flag() {
        for (args, says) in [
            (&["--bogus"][..], "unknown flag --bogus"),
            (
                &["--port", "70000"][..],
                "--port \"70000\": expected a port",
            ),
            (&["--port"][..], "--port needs a value"),
            (&["extra"][..], "unexpected argument \"extra\""),
            (&["-p", "1"][..], "unknown flag \"-p\""),
        ] {
            let e = cli(args).unwrap_err();
            assert!(e.0.contains(says), "{args:?}: {e}");
        }
    }
}
