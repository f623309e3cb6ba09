//! Which HCA pair carries a slice, and which slices travel together: pure functions of
//! the topology, the peer's priority matrix and the attempt number.

use std::borrow::Cow;
use std::collections::BTreeMap;

/// Candidate HCAs for one buffer location, as indices into a device list: the
/// preferred ones first, then the available ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    list: Vec<usize>,
    preferred: usize,
}

impl Choice {
    /// The candidates for `location` in `matrix` (`[preferred, available]` HCA names),
    /// among `devices`; names not in `devices` are skipped. A location without an entry,
    /// or whose entry names none of `devices`, may use every device.
    pub fn new(
        matrix: &BTreeMap<String, [Vec<String>; 2]>,
        location: &str,
        devices: &[&str],
    ) -> Self {
        let index = |name: &String| devices.iter().position(|d| d == name);
        let (mut list, mut preferred) = (Vec::new(), 0);
        if let Some([pref, avail]) = matrix.get(location) {
            for i in pref.iter().filter_map(index) {
                if !list.contains(&i) {
                    list.push(i);
                }
            }
            preferred = list.len();
            for i in avail.iter().filter_map(index) {
                if !list.contains(&i) {
                    list.push(i);
                }
            }
        }
        if list.is_empty() {
            list = (0..devices.len()).collect();
            preferred = list.len();
        }
        Self { list, preferred }
    }

    /// Device `index` alone: a batch whose caller named its NIC (`nic_hint`); retries
    /// then move on over the peer's devices only.
    pub fn only(index: usize) -> Self {
        Self {
            list: vec![index],
            preferred: 1,
        }
    }

    /// Number of candidates.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// The device for turn `rr` (round-robin over the preferred devices) at retry
    /// `step`: retries move on through preferred and then available devices.
    pub fn pick(&self, rr: usize, step: usize) -> Option<usize> {
        let n = self.list.len();
        if n == 0 {
            return None;
        }
        let start = rr % self.preferred.max(1);
        self.list.get((start + step) % n).copied()
    }
}

/// The local candidates of a slice: the device its batch's `nic_hint` names, alone, else
/// `by_location`. `None`: no device of `names` (the transport's, in order) has that name.
pub fn local<'a, 'n>(
    hint: Option<&str>,
    mut names: impl Iterator<Item = &'n str>,
    by_location: &'a Choice,
) -> Option<Cow<'a, Choice>> {
    match hint {
        None => Some(Cow::Borrowed(by_location)),
        Some(hint) => names
            .position(|n| n == hint)
            .map(|i| Cow::Owned(Choice::only(i))),
    }
}

/// The (local, remote) device pair for attempt `attempt` of a slice: the first attempt
/// uses the turn's preferred pair; each retry moves to the next local device, and after
/// every local device to the next remote one, so all pairs are tried in turn.
pub fn route(local: &Choice, remote: &Choice, rr: usize, attempt: usize) -> Option<(usize, usize)> {
    let locals = local.len().max(1);
    Some((
        local.pick(rr, attempt % locals)?,
        remote.pick(rr, attempt / locals)?,
    ))
}

/// Upstream's fragment limit: a last piece this small rides with the slice before it.
pub fn fragment_limit(slice_size: u64, fragment_ratio: u64) -> u64 {
    slice_size.checked_div(fragment_ratio).unwrap_or(0)
}

/// How upstream cuts `len` bytes: pieces of `slice_size`, the tail merged into the
/// previous piece when it is at most the fragment limit. `(offset, length)` pairs. (The
/// engine cuts at the slice size and [`super::worker::Work::absorbs`] merges the tail; the
/// tests check both agree.)
#[cfg(test)]
pub fn cut(len: u64, slice_size: u64, fragment_ratio: u64) -> Vec<(u64, u64)> {
    let slice_size = slice_size.max(1);
    let limit = fragment_limit(slice_size, fragment_ratio);
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut off = 0;
    while off < len {
        let n = slice_size.min(len - off);
        match out.last_mut() {
            Some(last) if n < slice_size && n <= limit => last.1 += n,
            _ => out.push((off, n)),
        }
        off += n;
    }
    out
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, reason = "tests index known-good data")]
mod tests {
    use super::*;

    fn matrix(entries: &[(&str, &[&str], &[&str])]) -> BTreeMap<String, [Vec<String>; 2]> {
        let names = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        entries
            .iter()
            .map(|(loc, p, a)| (loc.to_string(), [names(p), names(a)]))
            .collect()
    }

    #[test]
    fn cut_merges_a_small_tail_only() {
        assert_eq!(cut(65536 * 2, 65536, 4), vec![(0, 65536), (65536, 65536)]);
        // 16384 = slice / 4: merged.
        assert_eq!(cut(65536 + 16384, 65536, 4), vec![(0, 81920)]);
        // One byte more: its own slice.
        assert_eq!(
            cut(65536 + 16385, 65536, 4),
            vec![(0, 65536), (65536, 16385)]
        );
        // A request smaller than the limit is one slice.
        assert_eq!(cut(100, 65536, 4), vec![(0, 100)]);
        assert_eq!(cut(0, 65536, 4), vec![]);
        // Ratio 0: no merging.
        assert_eq!(cut(65537, 65536, 0), vec![(0, 65536), (65536, 1)]);
    }

    #[test]
    fn striping_round_robins_over_the_preferred_devices() {
        let devs = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"];
        for (pref, want) in [
            (&["mlx5_0"][..], vec![0, 0, 0, 0]),
            (&["mlx5_0", "mlx5_2"][..], vec![0, 2, 0, 2]),
            (&devs[..], vec![0, 1, 2, 3]),
        ] {
            let m = matrix(&[("cpu:0", pref, &["mlx5_3"])]);
            let c = Choice::new(&m, "cpu:0", &devs);
            let got: Vec<usize> = (0..4).map(|rr| c.pick(rr, 0).unwrap()).collect();
            assert_eq!(got, want, "{pref:?}");
        }
    }

    #[test]
    fn retries_walk_every_pair_and_unknown_locations_use_all_devices() {
        let m = matrix(&[("cpu:0", &["a"], &["b"])]);
        let local = Choice::new(&m, "cpu:0", &["a", "b", "zzz"]);
        assert_eq!(local.len(), 2, "zzz is in neither list");
        let remote = Choice::new(&m, "musa:3", &["x", "y"]);
        assert_eq!(remote.len(), 2);
        let pairs: Vec<_> = (0..4)
            .map(|a| route(&local, &remote, 0, a).unwrap())
            .collect();
        assert_eq!(pairs, vec![(0, 0), (1, 0), (0, 1), (1, 1)]);
        // Names the matrix lists but the device list lacks are skipped.
        let m = matrix(&[("cpu:0", &["gone"], &["b"])]);
        let c = Choice::new(&m, "cpu:0", &["a", "b"]);
        assert_eq!(c.pick(0, 0), Some(1));
        assert!(Choice::new(&m, "cpu:0", &[]).pick(0, 0).is_none());
    }
}
