//! The `transfer_engine_bench` command; see the `transfer_engine_bench` library.

fn main() {
    std::process::exit(transfer_engine_bench::main_with_args(std::env::args_os()));
}
