//! `cargo xtask`: parse the command line once, go to the workspace root, dispatch.

// The lints the workspace is adopting: a failure is an error that says what to do, not a panic.
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::undocumented_unsafe_blocks
)]

use std::process::ExitCode;

use xtask::flags;

fn main() -> ExitCode {
    match try_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The chain of causes, without a backtrace: every message says what to do next.
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

fn try_main() -> anyhow::Result<()> {
    let flags = flags::Xtask::from_env()?;
    let sh = xshell::Shell::new()?;
    sh.change_dir(xtask::project_root());
    match flags {
        flags::Xtask::Plan(cmd) => cmd.run(&sh),
        flags::Xtask::CheckBaseline(cmd) => cmd.run(&sh),
        flags::Xtask::Verify(cmd) => cmd.run(&sh),
        flags::Xtask::Release(cmd) => cmd.run(&sh),
        flags::Xtask::Publish(cmd) => cmd.run(&sh),
        flags::Xtask::Images(cmd) => cmd.run(&sh),
        flags::Xtask::PinBase(cmd) => cmd.run(&sh),
        flags::Xtask::RecordAttestation(cmd) => cmd.run(&sh),
    }
}
