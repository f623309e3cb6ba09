//! The command lines of the wheel's console scripts (`transfer_engine_bench`,
//! `mooncake-doctor`, `mooncake_http_metadata_server`, `mooncake_master`): long flags in the
//! forms upstream's gflags tools accept (`--name=value`, `--name value`, a bare boolean
//! `--flag` or `--flag=true|false`), `-h`/`--help`, and errors that name the flag and say
//! what to do. Tokenising is lexopt's; what each script accepts stays with the script.

use std::ffi::OsString;
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

impl std::error::Error for UsageError {}

impl UsageError {
    /// `--NAME`, which this script does not serve.
    pub fn unknown(name: &str) -> Self {
        Self(format!("unknown flag --{name}; see --help"))
    }

    /// `--NAME VALUE` where VALUE is none of `choices` (comma-separated).
    pub fn one_of(name: &str, value: &str, choices: &str) -> Self {
        Self(format!("--{name} {value:?}: expected one of {choices}"))
    }
}

/// Whether `args` (program name first) ask for help (`-h` or `--help` anywhere): help wins
/// over any error elsewhere on the line, as the scripts have always answered.
pub fn wants_help(args: &[String]) -> bool {
    args.iter().skip(1).any(|a| a == "-h" || a == "--help")
}

/// Walks a command line of long flags (program name already removed).
pub struct Flags {
    parser: lexopt::Parser,
    /// lexopt takes a bare `--` as the end of the flags; these scripts take no positional
    /// argument, so one is refused rather than silently ending the line.
    bare_dashes: bool,
}

impl Flags {
    /// `args` as `std::env::args` gives them: the first item (the program) is skipped.
    pub fn new(args: &[String]) -> Self {
        let rest: Vec<OsString> = args.iter().skip(1).map(OsString::from).collect();
        Self {
            bare_dashes: rest.iter().any(|a| a == "--"),
            parser: lexopt::Parser::from_args(rest),
        }
    }

    /// The next flag as (name without dashes, value after `=`), `None` at the end. Only
    /// long flags exist: a positional argument or a short flag is an error.
    pub fn next_flag(&mut self) -> Result<Option<(String, Option<String>)>, UsageError> {
        if self.bare_dashes {
            return Err(UsageError(
                "unexpected argument \"--\": this command takes flags only; see --help".into(),
            ));
        }
        let arg = match self.parser.next() {
            Ok(Some(arg)) => arg,
            Ok(None) => return Ok(None),
            Err(e) => return Err(UsageError(format!("{e}; see --help"))),
        };
        match arg {
            lexopt::Arg::Long(name) => {
                let name = name.to_string();
                let inline = match self.parser.optional_value() {
                    Some(v) => Some(utf8(&name, v)?),
                    None => None,
                };
                Ok(Some((name, inline)))
            }
            lexopt::Arg::Short(c) => Err(UsageError(format!(
                "unknown flag \"-{c}\": flags are long (`--name value`); see --help"
            ))),
            lexopt::Arg::Value(v) => Err(UsageError(format!(
                "unexpected argument {:?}: this command takes flags only; see --help",
                v.to_string_lossy()
            ))),
        }
    }

    /// The value of flag `name`: its `=value`, else the next item of the command line.
    pub fn value(&mut self, name: &str, inline: Option<String>) -> Result<String, UsageError> {
        if let Some(v) = inline {
            return Ok(v);
        }
        match self.parser.value() {
            Ok(v) => utf8(name, v),
            Err(_) => Err(UsageError(format!("--{name} needs a value; see --help"))),
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

/// A gflags boolean: bare `--name` is true, else `--name=true|false` (never the next item,
/// which gflags would not take either).
pub fn boolean(name: &str, inline: Option<&str>) -> Result<bool, UsageError> {
    match inline {
        None | Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(v) => Err(UsageError::one_of(name, v, "true, false")),
    }
}

/// A switch that takes no value: `--name=anything` is an error.
pub fn switch(name: &str, inline: Option<&str>) -> Result<(), UsageError> {
    match inline {
        None => Ok(()),
        Some(v) => Err(UsageError(format!("--{name} takes no value (got {v:?})"))),
    }
}

fn utf8(name: &str, v: OsString) -> Result<String, UsageError> {
    v.into_string()
        .map_err(|v| UsageError(format!("--{name} {v:?}: not valid UTF-8")))
}

/// One item of a gflags command line (see [`GflagsLine`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gflag {
    /// `-name`, `--name`, `-name=value` or `--name=value`: the name without dashes, the
    /// value after the first `=`.
    Flag {
        name: String,
        inline: Option<String>,
    },
    /// Anything that is not a flag, including the first item after a bare `--`.
    Positional(String),
}

/// A command line as gflags reads it, for `mooncake_master`, whose launch scripts come
/// from upstream: one dash is as good as two (`-rpc_port=1`, `-help`), which lexopt would
/// read as a cluster of short flags, so this walk is ours. Takes the arguments without the
/// program name.
pub struct GflagsLine {
    args: std::iter::Peekable<std::vec::IntoIter<String>>,
}

impl GflagsLine {
    pub fn new(args: &[String]) -> Self {
        Self {
            args: Vec::from(args).into_iter().peekable(),
        }
    }

    /// The next item, `None` at the end. A bare `--` ends the flags: what follows it, if
    /// anything, comes back as [`Gflag::Positional`] (this line takes none).
    pub fn next_item(&mut self) -> Option<Gflag> {
        let arg = self.args.next()?;
        if arg == "--" {
            return self.args.next().map(Gflag::Positional);
        }
        let body = arg
            .strip_prefix("--")
            .or_else(|| arg.strip_prefix('-'))
            .filter(|b| !b.is_empty());
        let Some(body) = body else {
            return Some(Gflag::Positional(arg));
        };
        Some(match body.split_once('=') {
            Some((n, v)) => Gflag::Flag {
                name: n.into(),
                inline: Some(v.into()),
            },
            None => Gflag::Flag {
                name: body.into(),
                inline: None,
            },
        })
    }

    /// The next item as the value of the flag just read (`--name VALUE`).
    pub fn value(&mut self, inline: Option<String>) -> Option<String> {
        inline.or_else(|| self.args.next())
    }

    /// The next item without taking it (glog's `-v` takes a number only when one follows).
    pub fn peek(&mut self) -> Option<&str> {
        self.args.peek().map(String::as_str)
    }
}

#[cfg(test)]
mod tests;
