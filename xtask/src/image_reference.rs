//! Image references as registries and `skopeo` spell them: `host[:port]/path[:tag][@sha256:hex]`.
//! Only what the release needs: is it pinned, where does it live, is that host loopback.

use std::fmt;

use anyhow::bail;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `host[:port]/path`, without tag or digest.
    pub name: String,
    pub tag: Option<String>,
    /// `sha256:<64 hex>`.
    pub digest: Option<String>,
}

impl ImageRef {
    pub fn parse(s: &str) -> anyhow::Result<ImageRef> {
        let (rest, digest) = match s.split_once('@') {
            Some((rest, d)) => (rest, Some(d)),
            None => (s, None),
        };
        if let Some(d) = digest {
            if !is_sha256_digest(d) {
                bail!("image reference {s:?}: the digest after `@` must be `sha256:` and 64 lowercase hex digits");
            }
        }
        // A `:` after the last `/` starts the tag; one before it is a registry port.
        let last_slash = rest.rfind('/').unwrap_or(0);
        let (name, tag) = match rest[last_slash..].find(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        // As docker does: a first component is a registry host when it has a `.` or a `:` or
        // is `localhost`; Docker Hub short names are refused, the host must be spelled out.
        let host = name.split('/').next().unwrap_or_default();
        let name_ok = name.contains('/')
            && (host.contains('.') || host.contains(':') || host == "localhost")
            && name.split('/').enumerate().all(|(i, c)| {
                // Only the registry host may carry a `:port`.
                !c.is_empty()
                    && c.bytes().all(|b| {
                        b.is_ascii_lowercase()
                            || b.is_ascii_digit()
                            || matches!(b, b'.' | b'-' | b'_')
                            || (i == 0 && matches!(b, b':' | b'[' | b']'))
                    })
            });
        if !name_ok {
            bail!(
                "image reference {s:?}: expected `registry.host[:port]/path[:tag][@sha256:<hex>]` \
                 (lowercase, with the registry host spelled out)"
            );
        }
        if let Some(t) = tag {
            let ok = !t.is_empty()
                && t.len() <= 128
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
            if !ok {
                bail!("image reference {s:?}: {t:?} is not a valid tag");
            }
        }
        Ok(ImageRef {
            name: name.to_owned(),
            tag: tag.map(str::to_owned),
            digest: digest.map(str::to_owned),
        })
    }

    pub fn is_pinned(&self) -> bool {
        self.digest.is_some()
    }

    /// The registry host (with port), the first path component.
    pub fn host(&self) -> &str {
        self.name.split('/').next().unwrap_or_default()
    }

    /// Loopback registries are plain HTTP: the only ones TLS verification is turned off for.
    pub fn is_loopback(&self) -> bool {
        is_loopback_host(self.host())
    }

    /// `name@digest`: what a build pulls, whatever the tag says today.
    pub fn by_digest(&self) -> Option<String> {
        self.digest.as_ref().map(|d| format!("{}@{d}", self.name))
    }

    /// `name:tag`, or `name` when untagged: what a registry is asked to resolve.
    pub fn by_tag(&self) -> String {
        match &self.tag {
            Some(t) => format!("{}:{t}", self.name),
            None => format!("{}:latest", self.name),
        }
    }

    pub fn with_digest(&self, digest: &str) -> ImageRef {
        ImageRef {
            digest: Some(digest.to_owned()),
            ..self.clone()
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

pub fn is_sha256_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// `host[:port]` names this machine: `localhost`, `127.x.y.z`, `[::1]`.
pub fn is_loopback_host(host_port: &str) -> bool {
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host_port.split(':').next().unwrap_or_default(),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references_parse_with_ports_tags_and_digests() {
        let r = ImageRef::parse("127.0.0.1:15000/test/base:bookworm").unwrap();
        assert_eq!(r.name, "127.0.0.1:15000/test/base");
        assert_eq!(r.tag.as_deref(), Some("bookworm"));
        assert!(!r.is_pinned() && r.is_loopback());
        assert_eq!(r.by_digest(), None);

        let s = format!(
            "registry.mthreads.com/mcconline/inference/vllm/vllm-openai:v0.28.0@sha256:{HEX}"
        );
        let r = ImageRef::parse(&s).unwrap();
        assert_eq!(r.host(), "registry.mthreads.com");
        assert!(r.is_pinned() && !r.is_loopback());
        assert_eq!(r.to_string(), s);
        assert_eq!(
            r.by_digest().unwrap(),
            format!("registry.mthreads.com/mcconline/inference/vllm/vllm-openai@sha256:{HEX}")
        );
        assert_eq!(
            r.by_tag(),
            "registry.mthreads.com/mcconline/inference/vllm/vllm-openai:v0.28.0"
        );

        let r = ImageRef::parse("localhost:5000/x").unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.by_tag(), "localhost:5000/x:latest");
        assert!(ImageRef::parse("[::1]:5000/x:1").unwrap().is_loopback());
    }

    #[test]
    fn bad_references_are_refused_with_the_reason() {
        for (bad, why) in [
            ("ubuntu:22.04", "registry host"),
            ("Registry.example/x:1", "lowercase"),
            ("r.example/x:1@sha256:abc", "64 lowercase hex"),
            ("r.example/x:1@md5:0123", "sha256:"),
            ("r.example/x:bad/tag", "registry host"),
            ("r.example/x:", "not a valid tag"),
        ] {
            let err = format!("{:#}", ImageRef::parse(bad).unwrap_err());
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
