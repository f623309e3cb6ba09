//! What the doctor found: checks with a status, what was seen and the fix; the exit code,
//! the JSON for machines and the table for people.

use std::fmt::Write as _;

use serde_json::{json, Value};

/// How a check went. Ordered: the worst status of a report decides its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// Nothing to do.
    Ok,
    /// Works, but not as well as it could, or will fail later.
    Warn,
    /// Broken: what the user asked for cannot work.
    Fail,
}

impl Status {
    /// `ok`, `warn` or `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Fail => "fail",
        }
    }
}

/// One check.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// Stable name (`rdma.memlock`): tests and scripts match on it.
    pub id: &'static str,
    /// How it went.
    pub status: Status,
    /// What was seen.
    pub saw: String,
    /// What to do (absent when the check is ok).
    pub fix: Option<String>,
    /// Facts behind `saw`, for `--json`.
    pub data: Value,
}

impl Check {
    /// An ok check.
    pub fn ok(id: &'static str, saw: impl Into<String>) -> Self {
        Self {
            id,
            status: Status::Ok,
            saw: saw.into(),
            fix: None,
            data: Value::Null,
        }
    }

    /// A warning with its fix.
    pub fn warn(id: &'static str, saw: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            status: Status::Warn,
            fix: Some(fix.into()),
            ..Self::ok(id, saw)
        }
    }

    /// A failure with its fix.
    pub fn fail(id: &'static str, saw: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            status: Status::Fail,
            fix: Some(fix.into()),
            ..Self::ok(id, saw)
        }
    }

    /// The same check carrying `data`.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = data;
        self
    }
}

/// Every check of one run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// In the order they ran.
    pub checks: Vec<Check>,
    /// Wall time of the run.
    pub elapsed_ms: u128,
}

impl Report {
    /// The worst status (ok for an empty report).
    pub fn status(&self) -> Status {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Ok)
    }

    /// 0 all ok, 1 warnings, 2 failures.
    pub fn exit_code(&self) -> i32 {
        match self.status() {
            Status::Ok => 0,
            Status::Warn => 1,
            Status::Fail => 2,
        }
    }

    /// The check named `id`.
    pub fn get(&self, id: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.id == id)
    }

    /// The `--json` document.
    pub fn to_json(&self) -> Value {
        let count = |s: Status| self.checks.iter().filter(|c| c.status == s).count();
        json!({
            "doctor": 1,
            "status": self.status().as_str(),
            "exit_code": self.exit_code(),
            "elapsed_ms": self.elapsed_ms as u64,
            "summary": {"ok": count(Status::Ok), "warn": count(Status::Warn), "fail": count(Status::Fail)},
            "checks": self.checks.iter().map(|c| json!({
                "id": c.id,
                "status": c.status.as_str(),
                "saw": c.saw,
                "fix": c.fix,
                "data": c.data,
            })).collect::<Vec<_>>(),
        })
    }

    /// The table for people; `colour` adds ANSI colours to the status column.
    pub fn to_table(&self, colour: bool) -> String {
        let width = self.checks.iter().map(|c| c.id.len()).max().unwrap_or(0);
        let mut out = String::new();
        for c in &self.checks {
            let tag = format!("{:<4}", c.status.as_str());
            let tag = match (colour, c.status) {
                (false, _) => tag,
                (true, Status::Ok) => format!("\x1b[32m{tag}\x1b[0m"),
                (true, Status::Warn) => format!("\x1b[33m{tag}\x1b[0m"),
                (true, Status::Fail) => format!("\x1b[31m{tag}\x1b[0m"),
            };
            let pad = " ".repeat(width + 9);
            let saw = c.saw.replace('\n', &format!("\n{pad}"));
            let _ = writeln!(out, "{tag}  {:<width$}  {saw}", c.id);
            if let Some(fix) = &c.fix {
                let _ = writeln!(out, "{pad}fix: {fix}");
            }
        }
        let count = |s: Status| self.checks.iter().filter(|c| c.status == s).count();
        let _ = writeln!(
            out,
            "\n{} ok, {} warning(s), {} failure(s) in {} ms (exit {})",
            count(Status::Ok),
            count(Status::Warn),
            count(Status::Fail),
            self.elapsed_ms,
            self.exit_code()
        );
        out
    }
}
