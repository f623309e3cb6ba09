//! The `transfer_engine_bench` command; see [`transfer_engine::bench`].

fn main() {
    std::process::exit(transfer_engine::bench::main_with_args(std::env::args_os()));
}
