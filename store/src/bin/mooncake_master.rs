//! `mooncake_master`: the store's master, standalone (the wheel's console script runs
//! the same code).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let level =
        transfer_engine::config::LogLevel::from_env_or(transfer_engine::config::LogLevel::Info);
    transfer_engine::logging::init(level);
    std::process::exit(mooncake_store::master::run::main(&args));
}
