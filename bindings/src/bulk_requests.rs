//! The requests of upstream 0.3.14's bulk calls, built from their compact argument shapes:
//! the `*_arrays` calls (three 8-byte integer arrays), the `*_pages` calls (page indices
//! times a field table) and the scatter calls (per region pair, ranges by offset).
//!
//! Everything here is plain Rust, so `cargo test` checks the expansion and its bounds
//! without Python.

use transfer_engine::{OpCode, Request};

use crate::errors::BindingError;

fn invalid(msg: String) -> BindingError {
    BindingError::InvalidArgument(msg)
}

/// Integers of an 8-byte array in native byte order, as the buffer protocol hands them.
/// `signed`: the array's format is a signed one (`q`, `l`, `n`); a negative entry is
/// then refused, since every value here is an address, length or index.
pub fn decode_u64s(what: &str, bytes: &[u8], signed: bool) -> Result<Vec<u64>, BindingError> {
    if !bytes.len().is_multiple_of(8) {
        return Err(invalid(format!(
            "{what}: {} bytes is not a whole number of 8-byte integers",
            bytes.len()
        )));
    }
    bytes
        .chunks_exact(8)
        .enumerate()
        .map(|(i, c)| {
            let mut word = [0u8; 8];
            word.copy_from_slice(c);
            let v = u64::from_ne_bytes(word);
            if signed && (v as i64) < 0 {
                return Err(invalid(format!(
                    "{what}[{i}] is negative ({}): addresses, lengths and page indices are unsigned",
                    v as i64
                )));
            }
            Ok(v)
        })
        .collect()
}

/// Columns of one row of a `*_pages` field table: `(src_base, src_stride, dst_base,
/// dst_stride, length)`.
pub const FIELD_COLUMNS: usize = 5;

/// The requests of `batch_transfer_sync_{write,read}_pages`: for every field row `f` and
/// page `i`, `length` bytes from `src_base + src_pages[i] * src_stride` to `dst_base +
/// dst_pages[i] * dst_stride`, field-major. The source is local for writes and remote for
/// reads (data moves from `src` to `dst` either way).
pub fn page_requests(
    op: OpCode,
    src_pages: &[u64],
    dst_pages: &[u64],
    fields: &[u64],
) -> Result<Vec<Request>, BindingError> {
    if src_pages.len() != dst_pages.len() {
        return Err(invalid(format!(
            "src_pages and dst_pages differ in length ({}, {})",
            src_pages.len(),
            dst_pages.len()
        )));
    }
    if !fields.len().is_multiple_of(FIELD_COLUMNS) {
        return Err(invalid(format!(
            "fields must be an [F, {FIELD_COLUMNS}] table; it has {} values",
            fields.len()
        )));
    }
    let mut out = Vec::with_capacity(fields.len() / FIELD_COLUMNS * src_pages.len());
    for (f, row) in fields.chunks_exact(FIELD_COLUMNS).enumerate() {
        let &[src_base, src_stride, dst_base, dst_stride, len] = row else {
            unreachable!("chunks_exact yields rows of FIELD_COLUMNS")
        };
        for (i, (&sp, &dp)) in src_pages.iter().zip(dst_pages).enumerate() {
            let at = |base: u64, page: u64, stride: u64| {
                page.checked_mul(stride)
                    .and_then(|o| base.checked_add(o))
                    .and_then(|a| a.checked_add(len).map(|_| a))
                    .ok_or_else(|| {
                        invalid(format!(
                            "fields[{f}] page {i}: {base:#x} + {page} * {stride} (+ {len} bytes) overflows 64 bits"
                        ))
                    })
            };
            let src = at(src_base, sp, src_stride)?;
            let dst = at(dst_base, dp, dst_stride)?;
            let (local, remote) = match op {
                OpCode::Write => (src, dst),
                OpCode::Read => (dst, src),
            };
            out.push(Request::new(op, local, remote, len));
        }
    }
    Ok(out)
}

/// One region pair of a scatter call: the bases and capacities on each side and its ranges.
pub struct ScatterRegion<'a> {
    /// Local base address.
    pub local_base: u64,
    /// Bytes usable from `local_base`.
    pub local_capacity: u64,
    /// Remote base address.
    pub remote_base: u64,
    /// Bytes usable from `remote_base`.
    pub remote_capacity: u64,
    /// Offsets of the ranges from `local_base`.
    pub local_offsets: &'a [u64],
    /// Offsets of the ranges from `remote_base`.
    pub remote_offsets: &'a [u64],
    /// Length of each range.
    pub lengths: &'a [u64],
}

/// The requests of a scatter call: every range of every region, each checked to lie
/// within its region's capacity on both sides (upstream refuses a range past either).
pub fn scatter_requests(
    op: OpCode,
    regions: &[ScatterRegion<'_>],
) -> Result<Vec<Request>, BindingError> {
    let mut out = Vec::new();
    for (r, reg) in regions.iter().enumerate() {
        let n = reg.lengths.len();
        if reg.local_offsets.len() != n || reg.remote_offsets.len() != n {
            return Err(invalid(format!(
                "region {r}: local_offsets, remote_offsets and lengths differ in length ({}, {}, {n})",
                reg.local_offsets.len(),
                reg.remote_offsets.len()
            )));
        }
        for j in 0..n {
            let len = reg.lengths[j];
            let within = |side: &str, off: u64, cap: u64| {
                if off.checked_add(len).is_some_and(|end| end <= cap) {
                    Ok(())
                } else {
                    Err(invalid(format!(
                        "region {r} range {j}: {side} offset {off} + length {len} exceeds its capacity {cap}"
                    )))
                }
            };
            within("local", reg.local_offsets[j], reg.local_capacity)?;
            within("remote", reg.remote_offsets[j], reg.remote_capacity)?;
            let local = reg.local_base.checked_add(reg.local_offsets[j]);
            let remote = reg.remote_base.checked_add(reg.remote_offsets[j]);
            let (Some(local), Some(remote)) = (local, remote) else {
                return Err(invalid(format!(
                    "region {r} range {j}: base + offset overflows 64 bits"
                )));
            };
            out.push(Request::new(op, local, remote, len));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn triples(reqs: &[Request]) -> Vec<(u64, u64, u64)> {
        reqs.iter().map(|r| (r.local, r.remote, r.len)).collect()
    }

    #[test]
    fn arrays_decode_and_refuse_negative_or_ragged() {
        let bytes: Vec<u8> = [7u64, 1 << 40]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        assert_eq!(decode_u64s("a", &bytes, true).unwrap(), vec![7, 1 << 40]);
        let neg: Vec<u8> = (-1i64).to_ne_bytes().to_vec();
        assert_eq!(decode_u64s("a", &neg, false).unwrap(), vec![u64::MAX]);
        let e = decode_u64s("lengths", &neg, true).unwrap_err().to_string();
        assert!(e.contains("lengths[0] is negative"), "{e}");
        assert!(decode_u64s("a", &[0; 12], false).is_err());
    }

    #[test]
    fn pages_expand_field_major_and_swap_sides_for_reads() {
        let fields = [
            0x1000, 0x100, 0x9000, 0x40, 16, 0x2000, 0x10, 0xa000, 0x20, 8,
        ];
        let w = page_requests(OpCode::Write, &[0, 2], &[1, 3], &fields).unwrap();
        assert_eq!(
            triples(&w),
            vec![
                (0x1000, 0x9040, 16),
                (0x1200, 0x90c0, 16),
                (0x2000, 0xa020, 8),
                (0x2020, 0xa060, 8)
            ]
        );
        let r = page_requests(OpCode::Read, &[0], &[1], &fields[..5]).unwrap();
        assert_eq!(triples(&r), vec![(0x9040, 0x1000, 16)]);
        assert!(page_requests(OpCode::Write, &[0], &[], &fields).is_err());
        assert!(page_requests(OpCode::Write, &[0], &[0], &fields[..4]).is_err());
        let huge = [u64::MAX, 2, 0, 0, 1];
        assert!(page_requests(OpCode::Write, &[1], &[0], &huge).is_err());
    }

    #[test]
    fn scatter_expands_ranges_within_capacity() {
        let reg = ScatterRegion {
            local_base: 0x1000,
            local_capacity: 64,
            remote_base: 0x8000,
            remote_capacity: 32,
            local_offsets: &[0, 48],
            remote_offsets: &[16, 0],
            lengths: &[16, 16],
        };
        let reqs = scatter_requests(OpCode::Write, &[reg]).unwrap();
        assert_eq!(
            triples(&reqs),
            vec![(0x1000, 0x8010, 16), (0x1030, 0x8000, 16)]
        );
        let past = ScatterRegion {
            local_base: 0,
            local_capacity: 64,
            remote_base: 0,
            remote_capacity: 32,
            local_offsets: &[0],
            remote_offsets: &[17],
            lengths: &[16],
        };
        let e = scatter_requests(OpCode::Read, &[past])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("remote offset 17 + length 16 exceeds its capacity 32"),
            "{e}"
        );
    }
}
