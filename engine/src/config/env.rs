//! Reading the environment: the lookup every section reads through ([`Env`]), and the
//! helpers that turn a value into a typed one or into an error naming the variable.

use super::ConfigError;

pub(super) struct Env<'a, F: Fn(&str) -> Option<String>> {
    pub(super) get: &'a F,
}

impl<F: Fn(&str) -> Option<String>> Env<'_, F> {
    pub(super) fn error(&self, var: &'static str, expected: &str) -> ConfigError {
        ConfigError {
            var,
            value: (self.get)(var).unwrap_or_default(),
            expected: expected.into(),
        }
    }

    pub(super) fn int<T: std::str::FromStr>(
        &self,
        var: &'static str,
        expected: &str,
    ) -> Result<Option<T>, ConfigError> {
        match (self.get)(var) {
            None => Ok(None),
            Some(v) => v.trim().parse::<T>().map(Some).map_err(|_| ConfigError {
                var,
                value: v,
                expected: expected.into(),
            }),
        }
    }

    pub(super) fn first_int<T: std::str::FromStr>(
        &self,
        vars: &[&'static str],
        expected: &str,
    ) -> Result<Option<(&'static str, T)>, ConfigError> {
        for &var in vars {
            if let Some(v) = self.int::<T>(var, expected)? {
                if var != vars[0] {
                    tracing::warn!("{var} is a misspelt alias; use {}", vars[0]);
                }
                return Ok(Some((var, v)));
            }
        }
        Ok(None)
    }

    pub(super) fn flag(&self, var: &'static str) -> Result<bool, ConfigError> {
        match (self.get)(var) {
            None => Ok(false),
            Some(v) if v.trim().is_empty() => Ok(true),
            Some(v) => {
                switch_word(&v).ok_or_else(|| self.error(var, "1/true/yes/on or 0/false/no/off"))
            }
        }
    }

    /// A switch whose unset or empty value keeps `default` (an empty value is not a
    /// request to change it).
    pub(super) fn switch(
        &self,
        var: &'static str,
        default: bool,
        expected: &str,
    ) -> Result<bool, ConfigError> {
        match (self.get)(var) {
            None => Ok(default),
            Some(v) if v.trim().is_empty() => Ok(default),
            Some(v) => switch_word(&v).ok_or_else(|| self.error(var, expected)),
        }
    }
}

pub(super) fn nonzero<T: Default + PartialEq + ToString>(
    var: &'static str,
    v: T,
) -> Result<T, ConfigError> {
    if v == T::default() {
        return Err(ConfigError {
            var,
            value: v.to_string(),
            expected: "a value greater than 0".into(),
        });
    }
    Ok(v)
}

pub(super) fn is_false_word(v: &str) -> bool {
    switch_word(v) == Some(false)
}

/// The words every on/off variable takes, in any case.
pub(super) fn switch_word(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Logs `msg` as a warning the first time this process sees it.
pub(super) fn warn_once(msg: &str) {
    if crate::log_throttle::first_time(msg) {
        tracing::warn!("{msg}");
    }
}
