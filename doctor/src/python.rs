//! `python.*`: the interpreter against the installed wheel's tags, and several
//! distributions that ship a `mooncake` package. Python gathers these facts
//! (`mooncake/doctor.py`) and passes them as JSON:
//!
//! ```json
//! {"python_version": "3.10.12", "implementation": "cpython", "interpreter_tag": "cp310",
//!  "machine": "x86_64", "system": "Linux", "glibc": "2.35",
//!  "wheel": {"name": "...", "version": "...", "tags": ["cp310-abi3-manylinux_2_35_x86_64"]},
//!  "distributions": [{"name": "...", "version": "...", "location": "...", "this_engine": true}]}
//! ```

use serde_json::{json, Value};

use crate::report::Check;

/// The Python checks over `facts`.
pub fn checks(facts: &Value) -> Vec<Check> {
    vec![tags(facts), distributions(facts)]
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn tags(facts: &Value) -> Check {
    let version = text(facts, "python_version");
    let imp = text(facts, "implementation");
    let machine = text(facts, "machine");
    let glibc = facts.get("glibc").and_then(Value::as_str);
    let interp = format!(
        "{imp} {version} on {} {machine}, glibc {}",
        text(facts, "system"),
        glibc.unwrap_or("none (not glibc)")
    );
    let wheel = facts.get("wheel").filter(|w| !w.is_null());
    let Some(wheel) = wheel else {
        return Check::ok(
            "python.wheel",
            format!("{interp}; the package was not installed from a wheel (source or editable build): no tags to compare"),
        )
        .with_data(facts.clone());
    };
    let tags: Vec<&str> = wheel
        .get("tags")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let here = Interpreter {
        implementation: imp,
        version: parse_version(version),
        machine,
        glibc: glibc.and_then(parse_version),
    };
    let verdicts: Vec<(String, Result<(), String>)> = tags
        .iter()
        .map(|t| (t.to_string(), here.accepts(t)))
        .collect();
    let name = format!("{} {}", text(wheel, "name"), text(wheel, "version"));
    let data = json!({"interpreter": facts, "tags": tags});
    if verdicts.iter().any(|(_, v)| v.is_ok()) || verdicts.is_empty() {
        return Check::ok(
            "python.wheel",
            format!("{interp}; wheel {name} tagged {} fits", tags.join(", ")),
        )
        .with_data(data);
    }
    let why: Vec<String> = verdicts
        .into_iter()
        .filter_map(|(t, v)| v.err().map(|e| format!("{t}: {e}")))
        .collect();
    Check::fail(
        "python.wheel",
        format!("{interp}; wheel {name} does not fit: {}", why.join("; ")),
        "the prebuilt wheel is for CPython 3.10 on Linux x86_64 with glibc 2.35 or newer (Ubuntu 22.04+): use such an environment (for example the vLLM-MUSA image), or build the wheel from source (scripts/build-wheel.sh)",
    )
    .with_data(data)
}

struct Interpreter<'a> {
    implementation: &'a str,
    version: Option<(u32, u32)>,
    machine: &'a str,
    glibc: Option<(u32, u32)>,
}

impl Interpreter<'_> {
    /// Whether a wheel tag `py-abi-platform` installs here, or why not.
    fn accepts(&self, tag: &str) -> Result<(), String> {
        let mut parts = tag.splitn(3, '-');
        let (Some(py), Some(abi), Some(plat)) = (parts.next(), parts.next(), parts.next()) else {
            return Err("not a wheel tag".into());
        };
        self.accepts_python(py, abi)?;
        self.accepts_platform(plat)
    }

    fn accepts_python(&self, py: &str, abi: &str) -> Result<(), String> {
        if py.starts_with("py3") {
            return Ok(());
        }
        let Some(digits) = py.strip_prefix("cp") else {
            return Err(format!("python tag {py} is not CPython"));
        };
        if self.implementation != "cpython" {
            return Err(format!(
                "{py} needs CPython, this is {}",
                self.implementation
            ));
        }
        let want = (
            digits.get(..1).and_then(|d| d.parse().ok()).unwrap_or(0),
            digits.get(1..).and_then(|d| d.parse().ok()).unwrap_or(0),
        );
        let Some(have) = self.version else {
            return Err("unknown Python version".into());
        };
        let fits = if abi == "abi3" {
            have >= want
        } else {
            have == want
        };
        if fits {
            Ok(())
        } else {
            Err(format!(
                "needs Python {}.{}{}, this is {}.{}",
                want.0,
                want.1,
                if abi == "abi3" { " or newer" } else { "" },
                have.0,
                have.1
            ))
        }
    }

    fn accepts_platform(&self, plat: &str) -> Result<(), String> {
        // A compressed tag set (`a.b`) fits when one of its members does.
        let mut errors = Vec::new();
        for p in plat.split('.') {
            match self.accepts_one_platform(p) {
                Ok(()) => return Ok(()),
                Err(e) => errors.push(e),
            }
        }
        Err(errors.join(", "))
    }

    fn accepts_one_platform(&self, p: &str) -> Result<(), String> {
        if p == "any" {
            return Ok(());
        }
        let (glibc_needed, arch) = if let Some(rest) = p.strip_prefix("manylinux_") {
            let mut it = rest.splitn(3, '_');
            let major = it.next().and_then(|m| m.parse().ok());
            let minor = it.next().and_then(|m| m.parse().ok());
            (major.zip(minor), it.next().unwrap_or(""))
        } else if let Some(arch) = p.strip_prefix("manylinux2014_") {
            (Some((2, 17)), arch)
        } else if let Some(arch) = p.strip_prefix("linux_") {
            (None, arch)
        } else {
            return Err(format!("platform {p} is not Linux"));
        };
        if arch != self.machine {
            return Err(format!(
                "built for {arch}, this machine is {}",
                self.machine
            ));
        }
        if let Some(need) = glibc_needed {
            match self.glibc {
                Some(have) if have >= need => {}
                Some(have) => {
                    return Err(format!(
                        "needs glibc {}.{} or newer, this system has {}.{}",
                        need.0, need.1, have.0, have.1
                    ))
                }
                None => return Err("needs glibc, this system has none (musl?)".into()),
            }
        }
        Ok(())
    }
}

fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut it = v.split('.');
    Some((it.next()?.parse().ok()?, it.next()?.trim().parse().ok()?))
}

fn distributions(facts: &Value) -> Check {
    let dists: Vec<&Value> = facts
        .get("distributions")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let named: Vec<String> = dists
        .iter()
        .map(|d| {
            format!(
                "{} {} ({})",
                text(d, "name"),
                text(d, "version"),
                text(d, "location")
            )
        })
        .collect();
    let data = json!({"distributions": dists});
    match named.len() {
        0 => Check::ok("python.distributions", "no installed distribution lists a mooncake package (running from a source tree)").with_data(data),
        1 => Check::ok("python.distributions", format!("mooncake comes from {}", named[0])).with_data(data),
        _ => Check::fail(
            "python.distributions",
            format!("{} installed distributions ship a `mooncake` package and overwrite each other's files: {}", named.len(), named.join("; ")),
            format!("keep one: `pip uninstall {}`, then `pip install --force-reinstall` the one you keep (the files they share were overwritten)", others(&dists).join(" ")),
        )
        .with_data(data),
    }
}

/// The distributions to remove: all but this engine's (`this_engine`), else all but the first.
fn others<'a>(dists: &[&'a Value]) -> Vec<&'a str> {
    let ours = |d: &Value| d.get("this_engine").and_then(Value::as_bool) == Some(true);
    let skip_first = !dists.iter().any(|d| ours(d));
    dists
        .iter()
        .enumerate()
        .filter(|(i, d)| if skip_first { *i > 0 } else { !ours(d) })
        .map(|(_, d)| text(d, "name"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(version: &str, glibc: Option<&str>, tags: &[&str]) -> Value {
        json!({"python_version": version, "implementation": "cpython", "machine": "x86_64",
               "system": "Linux", "glibc": glibc,
               "wheel": {"name": "mooncake-transfer-engine-musa", "version": "0.1.0", "tags": tags},
               "distributions": []})
    }

    #[test]
    fn tags_fit_or_say_why() {
        let tag = "cp310-cp310-manylinux_2_35_x86_64";
        let c = tags(&facts("3.10.12", Some("2.35"), &[tag]));
        assert_eq!(c.status, crate::report::Status::Ok, "{c:?}");
        let c = tags(&facts("3.11.4", Some("2.35"), &[tag]));
        assert_eq!(c.status, crate::report::Status::Fail);
        assert!(
            c.saw.contains("needs Python 3.10, this is 3.11"),
            "{}",
            c.saw
        );
        let c = tags(&facts("3.10.12", Some("2.31"), &[tag]));
        assert!(
            c.saw
                .contains("needs glibc 2.35 or newer, this system has 2.31"),
            "{}",
            c.saw
        );
        let abi3 = "cp39-abi3-manylinux_2_34_x86_64";
        assert_eq!(
            tags(&facts("3.12.1", Some("2.36"), &[abi3])).status,
            crate::report::Status::Ok
        );
        let c = tags(&facts(
            "3.12.1",
            Some("2.36"),
            &["cp39-abi3-manylinux_2_34_aarch64"],
        ));
        assert!(
            c.saw.contains("built for aarch64, this machine is x86_64"),
            "{}",
            c.saw
        );
    }
}
