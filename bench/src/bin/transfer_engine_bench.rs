//! The `transfer_engine_bench` command; see the `transfer_engine_bench` library.

fn main() {
    std::process::exit(transfer_engine_bench::main_with_args(
        // A flag that is not UTF-8 keeps its readable part; the parser then names it.
        std::env::args_os().map(|a| a.to_string_lossy().into_owned()),
    ));
}
