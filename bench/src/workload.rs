//! Named workloads: the request shapes a run takes unless its flags say otherwise, and the
//! list of targets a run spreads its batches over.

/// A preset for `--block_size`, `--batch_size` and `--threads`; a flag given explicitly
/// wins over the preset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// The flags' own defaults (64 KiB x 128, 12 threads), as upstream's bench.
    Custom,
    /// As vLLM's connector drives the engine: 10 threads, each a synchronous batch of 32
    /// requests of 32 KiB at a time.
    Serving,
    /// One 4 KiB request at a time from one thread: each batch's time is one request's.
    Latency,
}

/// How many bytes per request, requests per batch and submitting threads a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub block_size: u64,
    pub batch_size: usize,
    pub threads: usize,
}

impl Workload {
    /// The preset's shape.
    pub fn shape(self) -> Shape {
        match self {
            Workload::Custom => Shape {
                block_size: 65536,
                batch_size: 128,
                threads: 12,
            },
            Workload::Serving => Shape {
                block_size: 32 << 10,
                batch_size: 32,
                threads: 10,
            },
            Workload::Latency => Shape {
                block_size: 4096,
                batch_size: 1,
                threads: 1,
            },
        }
    }

    /// The name used in the JSON line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Custom => "custom",
            Workload::Serving => "serving",
            Workload::Latency => "latency",
        }
    }

    /// The preset, with every flag the caller gave in its place; each must be positive.
    pub fn resolve(
        self,
        block_size: Option<u64>,
        batch_size: Option<usize>,
        threads: Option<usize>,
    ) -> Result<Shape, String> {
        let preset = self.shape();
        let shape = Shape {
            block_size: block_size.unwrap_or(preset.block_size),
            batch_size: batch_size.unwrap_or(preset.batch_size),
            threads: threads.unwrap_or(preset.threads),
        };
        if shape.block_size == 0 || shape.batch_size == 0 || shape.threads == 0 {
            return Err("--block_size, --batch_size and --threads must be positive".into());
        }
        Ok(shape)
    }
}

/// The targets of `--segment_id`: one, or several separated by commas (each batch goes to
/// one of them, in turn).
pub fn parse_segments(list: &str) -> Result<Vec<String>, String> {
    if list.trim().is_empty() {
        return Err(
            "--segment_id is required in initiator mode (the target prints it; several targets: A,B,...)"
                .into(),
        );
    }
    let segments: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
    if let Some(i) = segments.iter().position(String::is_empty) {
        return Err(format!(
            "--segment_id={list}: entry {} is empty; give HOST:PORT[,HOST:PORT...]",
            i + 1
        ));
    }
    Ok(segments)
}

/// Which target the `n`th batch of thread `tid` goes to: threads start on different
/// targets and move on by one each batch, so every target gets an equal share whatever
/// the thread count.
pub fn target_of(tid: usize, n: u64, targets: usize) -> usize {
    ((tid as u64).wrapping_add(n) % targets.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_fill_only_the_flags_not_given() {
        let s = Workload::Serving.resolve(None, None, None).unwrap();
        assert_eq!(
            s,
            Shape {
                block_size: 32768,
                batch_size: 32,
                threads: 10
            }
        );
        let l = Workload::Latency.resolve(None, None, Some(4)).unwrap();
        assert_eq!((l.block_size, l.batch_size, l.threads), (4096, 1, 4));
        let c = Workload::Custom
            .resolve(Some(1 << 22), Some(64), None)
            .unwrap();
        assert_eq!((c.block_size, c.batch_size, c.threads), (1 << 22, 64, 12));
    }

    #[test]
    fn zero_sizes_are_refused_by_name() {
        let err = Workload::Serving.resolve(Some(0), None, None).unwrap_err();
        assert!(err.contains("--block_size"), "{err}");
        assert!(Workload::Latency.resolve(None, None, Some(0)).is_err());
    }

    #[test]
    fn segment_lists_split_on_commas_and_refuse_empty_entries() {
        assert_eq!(parse_segments("a:1").unwrap(), ["a:1"]);
        assert_eq!(
            parse_segments("a:1, b:2,c:3").unwrap(),
            ["a:1", "b:2", "c:3"]
        );
        let err = parse_segments("a:1,,b:2").unwrap_err();
        assert!(err.contains("entry 2 is empty"), "{err}");
        assert!(parse_segments(" ").unwrap_err().contains("required"));
    }

    #[test]
    fn batches_spread_evenly_over_targets() {
        let mut per_target = [0u32; 4];
        for tid in 0..10 {
            for n in 0..8 {
                per_target[target_of(tid, n, 4)] += 1;
            }
        }
        assert_eq!(per_target, [20; 4]);
        assert_eq!(target_of(7, 3, 1), 0);
    }
}
