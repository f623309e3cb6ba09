//! Which HCAs carry a transfer's slices: striping over the preferred ones, and a
//! caller's `nic_hint`.

use super::*;

/// The target of these tests: two HCAs, both preferred.
fn two_hca_peer(net: &Arc<Net>, fabric: &FakeFabric) -> Side {
    Side::new(
        net,
        fabric,
        "127.0.0.1:1002",
        &["b0", "b1"],
        topo(&[("cpu:0", &["b0", "b1"], &[])]),
        RdmaParams::default(),
    )
}

#[test]
fn slices_stripe_over_the_preferred_hcas() {
    let all = ["h0", "h1", "h2", "h3"];
    for (nics, preferred, used) in [
        (&all[..1], &all[..1], &all[..1]),
        (&all[..2], &all[..2], &all[..2]),
        (&all[..4], &all[..4], &all[..4]),
        (&all[..4], &["h1", "h3"][..], &["h1", "h3"][..]),
    ] {
        let fabric = FakeFabric::new();
        let net = Arc::new(Net::default());
        let local: Vec<String> = nics.iter().map(|n| format!("a_{n}")).collect();
        let local: Vec<&str> = local.iter().map(String::as_str).collect();
        let pref: Vec<String> = preferred.iter().map(|n| format!("a_{n}")).collect();
        let pref: Vec<&str> = pref.iter().map(String::as_str).collect();
        let rest: Vec<&str> = local
            .iter()
            .filter(|n| !pref.contains(n))
            .copied()
            .collect();
        let a = Side::new(
            &net,
            &fabric,
            "127.0.0.1:1001",
            &local,
            topo(&[("cpu:0", &pref, &rest)]),
            RdmaParams::default(),
        );
        let b = two_hca_peer(&net, &fabric);
        let slices = 4 * used.len() as u64;
        let data = pattern((slices * 65536) as usize, 3);
        a.buf.write_at(0, &data).unwrap();
        a.transfer(&b, OpCode::Write, 0, slices * 65536)
            .wait()
            .unwrap();
        assert_eq!(b.buf.read_at(0, data.len()).unwrap(), data);
        for n in &local {
            let want = if pref.contains(n) { 4 } else { 0 };
            assert_eq!(fabric.executed(n), want, "{n} with {pref:?} preferred");
        }
    }
}

#[test]
fn a_nic_hint_carries_every_slice_over_the_named_hca() {
    let fabric = FakeFabric::new();
    let net = Arc::new(Net::default());
    let nics = ["a_h0", "a_h1", "a_h2", "a_h3"];
    let a = Side::new(
        &net,
        &fabric,
        "127.0.0.1:1001",
        &nics,
        topo(&[("cpu:0", &nics, &[])]),
        RdmaParams::default(),
    );
    let b = two_hca_peer(&net, &fabric);
    assert_eq!(a.t.local_nics(), nics);
    let transports = [a.t.clone() as Arc<dyn Transport>];
    assert_eq!(crate::transport::unknown_nic("a_h2", &transports), None);
    let why = crate::transport::unknown_nic("mlx5_9", &transports).unwrap();
    assert_eq!((why.name.as_str(), why.protocol), ("mlx5_9", "rdma"));
    assert_eq!(why.nics, nics);
    assert!(
        why.to_string().contains("(a_h0, a_h1, a_h2, a_h3)"),
        "{why}"
    );
    let len = 8 * 65536;
    let data = pattern(len as usize, 9);
    a.buf.write_at(0, &data).unwrap();
    let (batch, slices) = a.slices(&b, OpCode::Write, 0, 0, len);
    batch.set_nic_hint("a_h2");
    a.t.post(&b.id(), &b.desc(), slices).unwrap();
    batch.wait().unwrap();
    assert_eq!(b.buf.read_at(0, data.len()).unwrap(), data);
    for n in nics {
        let want = if n == "a_h2" { 8 } else { 0 };
        assert_eq!(fabric.executed(n), want, "{n}");
    }
}
