//! The HCA allow-list: `MC_TE_FILTERS` (or its legacy alias) and the `device_name`
//! argument of `initialize`. Both narrow the HCAs found, as upstream applies both.

use crate::config::HcaFilter;

/// The HCAs kept and what to tell the user.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Filtered {
    /// HCAs that pass every filter, in the order found.
    pub kept: Vec<String>,
    /// A filter names an HCA this host lacks (each lists the HCAs present).
    pub warnings: Vec<String>,
    /// Set when HCAs exist but the filters leave none: why.
    pub none_matched: Option<String>,
}

/// Splits `device_name` as a comma list (blanks around names dropped; empty: no filter).
pub fn device_names(device_name: &str) -> Vec<String> {
    device_name
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Applies the environment's filter and the `device_name` list to the HCAs `present`.
pub fn apply(present: &[String], env: Option<&HcaFilter>, device_name: &str) -> Filtered {
    let arg = device_names(device_name);
    let mut lists: Vec<(String, &[String])> = Vec::new();
    if let Some(f) = env.filter(|f| !f.names.is_empty()) {
        lists.push((f.var.to_string(), &f.names));
    }
    if !arg.is_empty() {
        lists.push(("the device_name argument of initialize".into(), &arg));
    }
    let mut out = Filtered::default();
    let listing = if present.is_empty() {
        "none".to_string()
    } else {
        present.join(", ")
    };
    for (source, names) in &lists {
        for name in names.iter().filter(|n| !present.contains(n)) {
            out.warnings.push(format!(
                "{source} names HCA {name:?}, which this host does not have; HCAs present: {listing}"
            ));
        }
    }
    out.kept = present
        .iter()
        .filter(|h| lists.iter().all(|(_, names)| names.contains(h)))
        .cloned()
        .collect();
    if out.kept.is_empty() && !present.is_empty() {
        let what: Vec<String> = lists
            .iter()
            .map(|(source, names)| format!("{source} ({})", names.join(",")))
            .collect();
        out.none_matched = Some(format!(
            "{} match{} none of the HCAs present ({listing})",
            what.join(" and "),
            if what.len() == 1 { "es" } else { "" }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn present() -> Vec<String> {
        ["mlx5_0", "mlx5_1", "mlx5_2"].map(String::from).to_vec()
    }

    fn env(names: &[&str]) -> HcaFilter {
        HcaFilter {
            var: "MC_TE_FILTERS",
            names: names.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn no_filter_keeps_all() {
        let f = apply(&present(), None, "");
        assert_eq!(f.kept, present());
        assert!(f.warnings.is_empty() && f.none_matched.is_none());
        assert_eq!(apply(&present(), Some(&env(&[])), "").kept, present());
    }

    #[test]
    fn env_and_argument_both_narrow() {
        let f = apply(
            &present(),
            Some(&env(&["mlx5_0", "mlx5_2"])),
            " mlx5_2 ,mlx5_1",
        );
        assert_eq!(f.kept, ["mlx5_2"]);
        assert!(f.warnings.is_empty());
    }

    #[test]
    fn unknown_names_warn_and_list_what_exists() {
        let f = apply(&present(), Some(&env(&["mlx5_9", "mlx5_1"])), "");
        assert_eq!(f.kept, ["mlx5_1"]);
        assert_eq!(f.warnings.len(), 1);
        let w = &f.warnings[0];
        assert!(w.contains("MC_TE_FILTERS") && w.contains("mlx5_9"), "{w}");
        assert!(w.contains("HCAs present: mlx5_0, mlx5_1, mlx5_2"), "{w}");
        let none = apply(&present(), Some(&env(&["mlx5_9"])), "");
        assert!(none.kept.is_empty());
        assert!(none
            .none_matched
            .unwrap()
            .contains("MC_TE_FILTERS (mlx5_9)"));
    }
}
