//! Phases of a command: each prints its name, outcome and duration.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok(String),
    Skipped(String),
    Failed,
}

#[derive(Debug)]
pub struct Record {
    pub name: &'static str,
    pub outcome: Outcome,
    pub duration: Duration,
}

/// Runs phases in order and keeps what happened for the closing summary.
#[derive(Debug)]
pub struct Phases {
    command: String,
    started: Instant,
    pub records: Vec<Record>,
}

impl Phases {
    pub fn new(command: impl Into<String>) -> Phases {
        Phases {
            command: command.into(),
            started: Instant::now(),
            records: Vec::new(),
        }
    }

    /// Runs one phase. `f` returns its value and a one-line outcome.
    pub fn run<T>(
        &mut self,
        name: &'static str,
        f: impl FnOnce() -> anyhow::Result<(T, String)>,
    ) -> anyhow::Result<T> {
        eprintln!("==> {name}");
        let started = Instant::now();
        let result = f();
        let duration = started.elapsed();
        match result {
            Ok((value, outcome)) => {
                eprintln!("<== {name}: ok in {}: {outcome}", fmt_duration(duration));
                self.records.push(Record {
                    name,
                    outcome: Outcome::Ok(outcome),
                    duration,
                });
                Ok(value)
            }
            Err(e) => {
                eprintln!("<== {name}: FAILED in {}", fmt_duration(duration));
                self.records.push(Record {
                    name,
                    outcome: Outcome::Failed,
                    duration,
                });
                Err(e.context(format!("{} failed in phase `{name}`", self.command)))
            }
        }
    }

    pub fn skip(&mut self, name: &'static str, why: impl Into<String>) {
        let why = why.into();
        eprintln!("--- {name}: skipped: {why}");
        self.records.push(Record {
            name,
            outcome: Outcome::Skipped(why),
            duration: Duration::ZERO,
        });
    }

    pub fn summary(&self) -> String {
        let mut out = format!(
            "{} done in {}\n",
            self.command,
            fmt_duration(self.started.elapsed())
        );
        for r in &self.records {
            let outcome = match &r.outcome {
                Outcome::Ok(_) => "ok",
                Outcome::Skipped(_) => "skipped",
                Outcome::Failed => "FAILED",
            };
            out.push_str(&format!(
                "    {:<18} {:<8} {:>9}\n",
                r.name,
                outcome,
                fmt_duration(r.duration)
            ));
        }
        out
    }
}

pub fn fmt_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else {
        format!("{s:.1} s")
    }
}
