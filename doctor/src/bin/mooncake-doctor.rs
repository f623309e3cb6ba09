//! `mooncake-doctor` without Python (the wheel's console script adds the Python facts).

fn main() {
    // The report is the output: the engines of --selftest log only warnings unless asked.
    let level =
        transfer_engine::config::LogLevel::from_env_or(transfer_engine::config::LogLevel::Warning);
    transfer_engine::logging::init(level);
    let args: Vec<String> = std::env::args().collect();
    std::process::exit(transfer_engine_doctor::main_with_args(&args, None));
}
