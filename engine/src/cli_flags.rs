//! A small parser of `--name value` / `--name=value` command lines, for the console
//! scripts the wheel ships: a full argument-parsing crate cost the wheel about 0.2 MB.

use std::fmt;
use std::str::FromStr;

/// A command line that cannot be used; printed as `PROGRAM: MESSAGE` (exit status 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `args` (program name first) ask for help (`-h` or `--help` anywhere).
pub fn wants_help(args: &[String]) -> bool {
    args.iter().skip(1).any(|a| a == "-h" || a == "--help")
}

/// Walks a command line (program name already removed).
pub struct Flags {
    args: std::vec::IntoIter<String>,
}

impl Flags {
    /// `args` as `std::env::args` gives them: the first item (the program) is skipped.
    pub fn new(args: &[String]) -> Self {
        Self {
            args: args.get(1..).unwrap_or_default().to_vec().into_iter(),
        }
    }

    /// The next flag as (name without dashes, value after `=`), `None` at the end. Only
    /// long flags exist: a positional argument or a short flag is an error.
    pub fn next_flag(&mut self) -> Result<Option<(String, Option<String>)>, UsageError> {
        let Some(arg) = self.args.next() else {
            return Ok(None);
        };
        match arg.strip_prefix("--").filter(|body| !body.is_empty()) {
            Some(body) => Ok(Some(match body.split_once('=') {
                Some((name, value)) => (name.to_string(), Some(value.to_string())),
                None => (body.to_string(), None),
            })),
            None if arg.starts_with('-') && arg.len() > 1 => Err(UsageError(format!(
                "unknown flag {arg:?}: flags are long (`--name value`); see --help"
            ))),
            None => Err(UsageError(format!(
                "unexpected argument {arg:?}: this command takes flags only; see --help"
            ))),
        }
    }

    /// The value of flag `name`: its `=value`, else the next item of the command line.
    pub fn value(&mut self, name: &str, inline: Option<String>) -> Result<String, UsageError> {
        match inline {
            Some(v) => Ok(v),
            None => self
                .args
                .next()
                .ok_or_else(|| UsageError(format!("--{name} needs a value; see --help"))),
        }
    }

    /// The value of flag `name` parsed as `T`; `what` names the expected kind.
    pub fn parsed<T: FromStr>(
        &mut self,
        name: &str,
        inline: Option<String>,
        what: &str,
    ) -> Result<T, UsageError> {
        let v = self.value(name, inline)?;
        v.parse()
            .map_err(|_| UsageError(format!("--{name} {v:?}: expected {what}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &[&str]) -> Flags {
        let mut v = vec!["prog".to_string()];
        v.extend(args.iter().map(|s| s.to_string()));
        Flags::new(&v)
    }

    #[test]
    fn both_value_forms_and_help() {
        let mut f = line(&["--port", "80", "--host=::1"]);
        let (name, inline) = f.next_flag().unwrap().unwrap();
        assert_eq!(
            (name.as_str(), f.parsed::<u16>("port", inline, "a port")),
            ("port", Ok(80))
        );
        let (name, inline) = f.next_flag().unwrap().unwrap();
        assert_eq!(
            (name.as_str(), f.value("host", inline)),
            ("host", Ok("::1".into()))
        );
        assert_eq!(f.next_flag(), Ok(None));
        let args = ["p", "--port", "-h"].map(String::from);
        assert!(wants_help(&args) && !wants_help(&args[..2]));
    }

    #[test]
    fn missing_or_bad_values_and_other_arguments_are_named() {
        let mut f = line(&["--port"]);
        let (_, inline) = f.next_flag().unwrap().unwrap();
        let e = f.parsed::<u16>("port", inline, "a port").unwrap_err();
        assert!(e.0.contains("--port needs a value"), "{e}");
        let mut f = line(&["--port=http"]);
        let (_, inline) = f.next_flag().unwrap().unwrap();
        let e = f
            .parsed::<u16>("port", inline, "a port (0-65535)")
            .unwrap_err();
        assert!(e.0.contains("\"http\": expected a port"), "{e}");
        assert!(line(&["-p"])
            .next_flag()
            .unwrap_err()
            .0
            .contains("unknown flag \"-p\""));
        assert!(line(&["x"])
            .next_flag()
            .unwrap_err()
            .0
            .contains("unexpected argument \"x\""));
        assert!(line(&["--"]).next_flag().is_err());
    }
}
