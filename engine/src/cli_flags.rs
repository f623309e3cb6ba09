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

/// One item of a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    /// `--name` or `--name=value` (the name without its dashes).
    Flag {
        /// The flag's name, without the leading `--`.
        name: String,
        /// The value written after `=`, if any.
        inline: Option<String>,
    },
    /// `-h` or `--help`.
    Help,
    /// Anything not starting with `-`.
    Positional(String),
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

    /// The next item; a lone `-x` other than `-h` is an error (only long flags exist).
    pub fn next_arg(&mut self) -> Option<Result<Arg, UsageError>> {
        let arg = self.args.next()?;
        Some(match arg.as_str() {
            "-h" | "--help" => Ok(Arg::Help),
            a if a.starts_with("--") && a.len() > 2 => {
                let body = &a[2..];
                Ok(match body.split_once('=') {
                    Some((name, value)) => Arg::Flag {
                        name: name.to_string(),
                        inline: Some(value.to_string()),
                    },
                    None => Arg::Flag {
                        name: body.to_string(),
                        inline: None,
                    },
                })
            }
            a if a.starts_with('-') && a.len() > 1 => Err(UsageError(format!(
                "unknown flag {a:?}: flags are long (`--name value`); see --help"
            ))),
            _ => Ok(Arg::Positional(arg)),
        })
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
        let mut f = line(&["--port", "80", "--host=::1", "-h", "x"]);
        let Some(Ok(Arg::Flag { name, inline })) = f.next_arg() else {
            panic!("flag expected")
        };
        assert_eq!(
            (name.as_str(), f.parsed::<u16>("port", inline, "a port")),
            ("port", Ok(80))
        );
        let Some(Ok(Arg::Flag { name, inline })) = f.next_arg() else {
            panic!("flag expected")
        };
        assert_eq!(
            (name.as_str(), f.value("host", inline)),
            ("host", Ok("::1".into()))
        );
        assert_eq!(f.next_arg(), Some(Ok(Arg::Help)));
        assert_eq!(f.next_arg(), Some(Ok(Arg::Positional("x".into()))));
        assert_eq!(f.next_arg(), None);
    }

    #[test]
    fn missing_or_bad_values_and_short_flags_are_named() {
        let mut f = line(&["--port"]);
        let Some(Ok(Arg::Flag { inline, .. })) = f.next_arg() else {
            panic!("flag expected")
        };
        let e = f.parsed::<u16>("port", inline, "a port").unwrap_err();
        assert!(e.0.contains("--port needs a value"), "{e}");
        let mut f = line(&["--port=http"]);
        let Some(Ok(Arg::Flag { inline, .. })) = f.next_arg() else {
            panic!("flag expected")
        };
        let e = f
            .parsed::<u16>("port", inline, "a port (0-65535)")
            .unwrap_err();
        assert!(e.0.contains("\"http\": expected a port"), "{e}");
        assert!(line(&["-p"]).next_arg().is_some_and(|r| r.is_err()));
        assert!(line(&[]).next_arg().is_none());
    }
}
