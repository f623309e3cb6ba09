//! `cargo xtask check-baseline`: is this host the release baseline?

use xshell::Shell;

use crate::flags;
use crate::release::verify::{self, BaselineMode};
use crate::Workspace;

impl flags::CheckBaseline {
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let ws = Workspace::load(sh)?;
        let mode = BaselineMode::from_flag(self.strict_baseline);
        let report = verify::baseline(sh, &ws.config.baseline, mode)?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        eprintln!("{}", report.outcome());
        Ok(())
    }
}
