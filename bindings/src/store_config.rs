//! `MooncakeDistributedStore.setup`'s arguments in every form the consumers use:
//! positional (vLLM, LMCache), keywords with `engine=` (SGLang), or one dict; sizes as
//! integers or strings such as `"4GB"` (vLLM's JSON config).

/// Sizes as the consumers write them: `1073741824`, `"4GB"`, `"512 MiB"`, `"16mb"`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        format!("size {s:?}: expected a number of bytes or a number with KB/MB/GB/TB")
    })?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => {
            return Err(format!(
                "size {s:?}: unknown unit {u:?} (use B, KB, MB, GB or TB)"
            ))
        }
    };
    let bytes = value * mult as f64;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64) {
        return Err(format!("size {s:?} is out of range"));
    }
    Ok(bytes as u64)
}

/// Upstream's defaults (16 MiB each, TCP, the master on this host).
pub const DEFAULT_SEGMENT: u64 = 16 << 20;
pub const DEFAULT_MASTER: &str = "127.0.0.1:50051";

#[cfg(feature = "python")]
pub use py::SetupArgs;

#[cfg(feature = "python")]
mod py {
    use pyo3::exceptions::{PyTypeError, PyValueError};
    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    use super::{parse_size, DEFAULT_MASTER, DEFAULT_SEGMENT};

    /// `setup`'s arguments, resolved.
    pub struct SetupArgs {
        pub local_hostname: String,
        pub metadata_server: String,
        pub global_segment_size: u64,
        pub local_buffer_size: u64,
        pub protocol: String,
        pub device_name: String,
        pub master_server_addr: String,
    }

    fn size_arg(name: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
        let Some(v) = v.filter(|v| !v.is_none()) else {
            return Ok(DEFAULT_SEGMENT);
        };
        if let Ok(n) = v.extract::<u64>() {
            return Ok(n);
        }
        if let Ok(s) = v.extract::<String>() {
            return parse_size(&s).map_err(|e| PyValueError::new_err(format!("{name}: {e}")));
        }
        Err(PyTypeError::new_err(format!(
            "{name}: expected an int or a string like \"4GB\""
        )))
    }

    /// Upstream options that change what the store does and that this store does not
    /// serve: set, they are refused rather than ignored.
    const REFUSED: &[&str] = &[
        "enable_ssd_offload",
        "ssd_offload_path",
        "enable_client_http_server",
        "ipc_socket_path",
    ];
    /// Accepted and without effect here.
    const IGNORED: &[&str] = &["tenant_id", "client_http_port"];

    impl SetupArgs {
        #[allow(clippy::too_many_arguments)]
        pub fn collect(
            first: &Bound<'_, PyAny>,
            metadata_server: Option<String>,
            global_segment_size: Option<&Bound<'_, PyAny>>,
            local_buffer_size: Option<&Bound<'_, PyAny>>,
            protocol: Option<String>,
            rdma_devices: Option<String>,
            master_server_addr: Option<String>,
            kwargs: Option<&Bound<'_, PyDict>>,
        ) -> PyResult<Self> {
            if let Ok(dict) = first.cast::<PyDict>() {
                return Self::from_dict(dict);
            }
            let mut device_name = rdma_devices;
            if let Some(kw) = kwargs {
                for (k, v) in kw.iter() {
                    let k: String = k.extract()?;
                    match k.as_str() {
                        "device_name" => device_name = Some(v.extract()?),
                        k if IGNORED.contains(&k) => {}
                        k if REFUSED.contains(&k) => {
                            if v.is_truthy()? {
                                return Err(PyValueError::new_err(format!(
                                    "setup: {k} is an upstream feature this store does not serve"
                                )));
                            }
                        }
                        k => {
                            return Err(PyTypeError::new_err(format!(
                                "setup() got an unexpected keyword argument {k:?}"
                            )))
                        }
                    }
                }
            }
            Ok(Self {
                local_hostname: first.extract().map_err(|_| {
                    PyTypeError::new_err(
                        "setup: local_hostname must be a str (or pass one dict of settings)",
                    )
                })?,
                metadata_server: metadata_server.unwrap_or_else(|| "P2PHANDSHAKE".into()),
                global_segment_size: size_arg("global_segment_size", global_segment_size)?,
                local_buffer_size: size_arg("local_buffer_size", local_buffer_size)?,
                protocol: protocol.unwrap_or_else(|| "tcp".into()),
                device_name: device_name.unwrap_or_default(),
                master_server_addr: master_server_addr.unwrap_or_else(|| DEFAULT_MASTER.into()),
            })
        }

        fn from_dict(d: &Bound<'_, PyDict>) -> PyResult<Self> {
            let get_str = |k: &str| -> PyResult<Option<String>> {
                d.get_item(k)?
                    .filter(|v| !v.is_none())
                    .map(|v| v.extract())
                    .transpose()
            };
            for (k, v) in d.iter() {
                let k: String = k.extract()?;
                if REFUSED.contains(&k.as_str()) && v.is_truthy()? {
                    return Err(PyValueError::new_err(format!(
                        "setup: {k} is an upstream feature this store does not serve"
                    )));
                }
            }
            let local_hostname = get_str("local_hostname")?.ok_or_else(|| {
                PyValueError::new_err("setup(config): local_hostname is required")
            })?;
            let metadata_server = get_str("metadata_server")?.ok_or_else(|| {
                PyValueError::new_err("setup(config): metadata_server is required")
            })?;
            Ok(Self {
                local_hostname,
                metadata_server,
                global_segment_size: size_arg(
                    "global_segment_size",
                    d.get_item("global_segment_size")?.as_ref(),
                )?,
                local_buffer_size: size_arg(
                    "local_buffer_size",
                    d.get_item("local_buffer_size")?.as_ref(),
                )?,
                protocol: get_str("protocol")?.unwrap_or_else(|| "tcp".into()),
                device_name: get_str("rdma_devices")?
                    .or(get_str("device_name")?)
                    .unwrap_or_default(),
                master_server_addr: get_str("master_server_addr")?
                    .or(get_str("master_server_address")?)
                    .unwrap_or_else(|| DEFAULT_MASTER.into()),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_the_consumers_forms() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("4GB"), Ok(4 << 30));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("16mb"), Ok(16 << 20));
        assert_eq!(parse_size("1.5KB"), Ok(1536));
        assert!(parse_size("4XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("GB").is_err());
        assert!(parse_size("").is_err());
    }
}
