//! Upstream's topology JSON: an object mapping each location to exactly two arrays of
//! HCA names, `[preferred, available]`. Printed by `get_local_topology`, read from the
//! file `MC_CUSTOM_TOPO_JSON` names, and advertised to peers as `priority_matrix`.

use std::path::{Path, PathBuf};

use thiserror::Error;

use super::Topology;

/// Why a topology JSON is refused.
#[derive(Debug, Error)]
pub enum ShapeError {
    /// Not JSON at all.
    #[error("not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// Not an object at the top.
    #[error("the top level must be an object mapping locations to [[preferred], [available]]")]
    NotObject,
    /// A location that does not map to two arrays of names.
    #[error("location {location:?} must map to exactly two arrays of HCA names, [[preferred...], [available...]]")]
    Location {
        /// The location.
        location: String,
    },
}

/// Why the file `MC_CUSTOM_TOPO_JSON` names cannot be used.
#[derive(Debug, Error)]
pub enum TopoFileError {
    /// It cannot be read.
    #[error("MC_CUSTOM_TOPO_JSON={}: cannot read the file: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// It is not a topology.
    #[error("MC_CUSTOM_TOPO_JSON={}: {source}", .path.display())]
    Shape {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: ShapeError,
    },
}

/// The JSON text upstream's `get_local_topology` returns (pretty-printed).
pub fn to_json(topo: &Topology) -> String {
    serde_json::to_string_pretty(topo).unwrap_or_else(|_| "{}".into())
}

/// Parses a topology, refusing any other shape than upstream's parser accepts.
pub fn parse(text: &str) -> Result<Topology, ShapeError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(ShapeError::NotJson)?;
    let object = value.as_object().ok_or(ShapeError::NotObject)?;
    let mut topo = Topology::new();
    for (location, entry) in object {
        let shape_err = || ShapeError::Location {
            location: location.clone(),
        };
        let pair = entry
            .as_array()
            .filter(|a| a.len() == 2)
            .ok_or_else(shape_err)?;
        let mut lists: [Vec<String>; 2] = [Vec::new(), Vec::new()];
        for (list, names) in lists.iter_mut().zip(pair) {
            for name in names.as_array().ok_or_else(shape_err)? {
                list.push(name.as_str().ok_or_else(shape_err)?.to_string());
            }
        }
        topo.insert(location.clone(), lists);
    }
    Ok(topo)
}

/// Reads and parses the file `MC_CUSTOM_TOPO_JSON` names.
pub fn load(path: &Path) -> Result<Topology, TopoFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| TopoFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text).map_err(|source| TopoFileError::Shape {
        path: path.to_path_buf(),
        source,
    })
}

/// Every HCA name the topology mentions, in first-seen order.
pub fn hca_names(topo: &Topology) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for name in topo.values().flatten().flatten() {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_shape_round_trips() {
        let text = r#"{"cpu:0": [["mlx5_0","mlx5_1"], ["mlx5_2"]], "musa:0": [["mlx5_0"], []]}"#;
        let t = parse(text).unwrap();
        assert_eq!(t["cpu:0"], [vec!["mlx5_0", "mlx5_1"], vec!["mlx5_2"]]);
        assert_eq!(parse(&to_json(&t)).unwrap(), t);
        assert_eq!(hca_names(&t), ["mlx5_0", "mlx5_1", "mlx5_2"]);
    }

    #[test]
    fn other_shapes_are_refused_naming_the_location() {
        for bad in [
            r#"{"cpu:0": [["mlx5_0"]]}"#,
            r#"{"cpu:0": [["mlx5_0"], [], []]}"#,
            r#"{"cpu:0": [["mlx5_0"], "mlx5_1"]}"#,
            r#"{"cpu:0": [[1], []]}"#,
            r#"{"cpu:0": {"preferred": []}}"#,
        ] {
            let err = parse(bad).unwrap_err();
            assert!(
                matches!(&err, ShapeError::Location { location } if location == "cpu:0"),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains("\"cpu:0\""), "{bad}: {err}");
        }
        assert!(matches!(parse("[]"), Err(ShapeError::NotObject)));
        assert!(parse("{")
            .unwrap_err()
            .to_string()
            .contains("not valid JSON"));
    }
}
