//! Master election through a real etcd (Debian's `etcd-server`, started by each test on
//! 127.0.0.1 at free ports with a temporary data directory, killed when the test ends,
//! failed or not): one leader of two campaigners, a resignation handing over at once, a
//! leader whose renewals stop replaced within the lease TTL, a lost leadership noticed
//! (key deleted, key overwritten, etcd gone), cluster ids kept apart, and an unreachable
//! etcd failing within the timeout.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mooncake_store::ha::{self, campaign, current_leader, HaError, Leadership};

/// Short, so that the whole file runs in seconds; etcd's minimum is about this anyway.
const TTL: Duration = Duration::from_secs(2);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An etcd server on 127.0.0.1; killed, and its data removed, on drop.
struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
}

impl Etcd {
    #[allow(clippy::zombie_processes, reason = "reaped in `kill`, from Drop too")]
    fn start() -> Self {
        let port = free_port();
        let peer = free_port();
        let dir = std::env::temp_dir().join(format!("ms-ha-etcd-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
        let client_url = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "ms-ha", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("ms-ha={peer_url}")])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start etcd ({e}): these tests need a real etcd; install it with \
                     scripts/install-deps.sh (Debian package etcd-server)"
                )
            });
        let e = Self {
            child: Some(child),
            dir,
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "etcd did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        e
    }

    fn endpoints(&self) -> Vec<String> {
        vec![format!("127.0.0.1:{}", self.port)]
    }

    /// Waits until etcd serves requests (it listens before it has elected itself).
    async fn ready(&self) {
        current_leader(&self.endpoints(), "probe", Duration::from_secs(20))
            .await
            .unwrap();
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            if let Ok(log) = std::fs::read_to_string(self.dir.join("etcd.log")) {
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                eprintln!("etcd's log, last lines first:\n{}", tail.join("\n"));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn leader_of(etcd: &Etcd, cluster: &str) -> Option<String> {
    current_leader(&etcd.endpoints(), cluster, Duration::from_secs(5))
        .await
        .unwrap()
}

async fn raw_client(etcd: &Etcd) -> mooncake_etcd::Client {
    mooncake_etcd::Client::connect([format!("http://127.0.0.1:{}", etcd.port)], None)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_two_leads_and_a_resignation_hands_over_at_once() {
    let etcd = Etcd::start();
    etcd.ready().await;
    let eps = etcd.endpoints();
    let mut a = tokio::spawn({
        let eps = eps.clone();
        async move { campaign(&eps, "c", "10.0.0.1:50051", TTL).await }
    });
    let mut b = tokio::spawn({
        let eps = eps.clone();
        async move { campaign(&eps, "c", "10.0.0.2:50051", TTL).await }
    });
    let (first, standby) = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::select! {
            r = &mut a => (r, b),
            r = &mut b => (r, a),
        }
    })
    .await
    .expect("one of the two is elected");
    let leader: Leadership = first.unwrap().unwrap();

    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!standby.is_finished(), "both lead");
    assert_eq!(
        leader_of(&etcd, "c").await.as_deref(),
        Some(leader.address())
    );
    let old = leader.address().to_string();

    let t = Instant::now();
    leader.resign().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(3), standby)
        .await
        .expect("the standby is elected after the resignation")
        .unwrap()
        .unwrap();
    let took = t.elapsed();
    eprintln!("resignation to new leader: {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_ne!(next.address(), old);
    assert_eq!(leader_of(&etcd, "c").await.as_deref(), Some(next.address()));

    next.resign().await.unwrap();
    assert_eq!(leader_of(&etcd, "c").await, None);
}

#[test]
fn a_leader_that_stops_renewing_is_replaced_within_the_ttl() {
    let etcd = Etcd::start();
    let main_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    main_rt.block_on(etcd.ready());
    let eps = etcd.endpoints();

    // The leader lives on a runtime of its own: shutting that down is the leader's
    // process stopping, renewal task and all.
    let leader_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let a = leader_rt.block_on(campaign(&eps, "c", "a:1", TTL)).unwrap();
    assert_eq!(a.ttl(), TTL);
    let b = main_rt.spawn({
        let eps = eps.clone();
        async move { campaign(&eps, "c", "b:1", TTL).await }
    });

    // Renewals keep the leader (and its fence) past its TTL.
    let fence = a.fence();
    std::thread::sleep(TTL + Duration::from_secs(1));
    assert!(!b.is_finished(), "the standby took over from a live leader");
    assert!(fence.holds(), "a renewed lease's fence stopped holding");
    assert_eq!(
        main_rt.block_on(leader_of(&etcd, "c")).as_deref(),
        Some("a:1")
    );

    let t = Instant::now();
    drop(leader_rt);
    let b = main_rt
        .block_on(async { tokio::time::timeout(TTL + Duration::from_secs(3), b).await })
        .expect("the standby is elected once the lease expires")
        .unwrap()
        .unwrap();
    // The old leader's fence, read by its own clock with nothing left to revoke it, has run
    // out by the time the standby leads: never two masters serving.
    assert!(
        !fence.holds(),
        "the old leader's fence holds while the standby leads"
    );
    let took = t.elapsed();
    eprintln!("leader stopped to new leader: {took:?} (ttl {TTL:?})");
    assert!(took <= TTL + Duration::from_secs(1), "{took:?}");
    assert_eq!(b.address(), "b:1");
    assert_eq!(
        main_rt.block_on(leader_of(&etcd, "c")).as_deref(),
        Some("b:1")
    );
    // Dropping a leadership whose runtime is gone is harmless.
    drop(a);
    main_rt.block_on(b.resign()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_leadership_is_noticed() {
    let mut etcd = Etcd::start();
    etcd.ready().await;
    let eps = etcd.endpoints();
    let key = ha::leader_key("c");
    let mut raw = raw_client(&etcd).await;

    // An operator deletes the key.
    let l = campaign(&eps, "c", "a:1", TTL).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), l.lost())
            .await
            .is_err(),
        "lost without cause"
    );
    assert_eq!(l.why_lost(), None);
    let fence = l.fence();
    assert!(fence.holds());
    let t = Instant::now();
    raw.delete(key.as_str(), None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), l.lost())
        .await
        .expect("a deleted key ends the leadership");
    assert!(!fence.holds(), "a lost leadership's fence still holds");
    eprintln!("key deleted to lost: {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(1));
    let why = l.why_lost().unwrap();
    assert!(why.contains("deleted"), "{why}");
    drop(l);

    // Someone writes the key over, without our lease.
    let l = campaign(&eps, "c", "a:1", TTL).await.unwrap();
    raw.put(key.as_str(), "intruder:1", None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), l.lost())
        .await
        .expect("an overwritten key ends the leadership");
    let why = l.why_lost().unwrap();
    assert!(
        why.contains("overwritten") && why.contains("intruder:1"),
        "{why}"
    );
    assert_eq!(leader_of(&etcd, "c").await.as_deref(), Some("intruder:1"));
    drop(l);
    raw.delete(key.as_str(), None).await.unwrap();

    // etcd goes away: no renewal is confirmed, and the leader steps down within the TTL.
    let l = campaign(&eps, "c", "a:1", TTL).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    etcd.kill();
    let fence = l.fence();
    tokio::time::timeout(TTL + Duration::from_secs(1), l.lost())
        .await
        .expect("renewals that fail for the TTL end the leadership");
    assert!(!fence.holds());
    let took = t.elapsed();
    eprintln!("etcd killed to lost: {took:?} (ttl {TTL:?})");
    assert!(took <= TTL + Duration::from_millis(200), "{took:?}");
    let why = l.why_lost().unwrap();
    assert!(why.contains("renewal"), "{why}");
    // Resigning with etcd gone fails with the reason, and does not hang.
    let t = Instant::now();
    let e = l.resign().await.unwrap_err();
    assert!(t.elapsed() < ha::CONNECT_TIMEOUT + Duration::from_secs(1));
    assert!(matches!(e, HaError::Unreachable { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_ids_are_independent() {
    let etcd = Etcd::start();
    etcd.ready().await;
    // A dead endpoint before the live one: the client settles on the live one.
    let eps = vec![
        format!("127.0.0.1:{}", free_port()),
        etcd.endpoints()[0].clone(),
    ];
    let within = Duration::from_secs(5);
    let a = tokio::time::timeout(within, campaign(&eps, "c1", "a:1", TTL))
        .await
        .expect("c1 has no leader yet")
        .unwrap();
    let b = tokio::time::timeout(within, campaign(&eps, "c2", "b:1", TTL))
        .await
        .expect("c2 has no leader yet")
        .unwrap();
    assert_eq!(leader_of(&etcd, "c1").await.as_deref(), Some("a:1"));
    assert_eq!(leader_of(&etcd, "c2").await.as_deref(), Some("b:1"));
    assert_eq!(leader_of(&etcd, "c3").await, None);
    assert_eq!(
        current_leader(&eps, "c1", within).await.unwrap().as_deref(),
        Some("a:1")
    );

    a.resign().await.unwrap();
    assert_eq!(leader_of(&etcd, "c1").await, None);
    assert_eq!(leader_of(&etcd, "c2").await.as_deref(), Some("b:1"));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), b.lost())
            .await
            .is_err(),
        "another cluster's resignation ended this leadership"
    );
    b.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_etcd_fails_within_the_timeout() {
    // Nothing listens on `refused`; `silent` accepts connections and never answers.
    let refused = format!("127.0.0.1:{}", free_port());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
    let within = Duration::from_secs(1);
    for ep in [&refused, &silent] {
        let t = Instant::now();
        let e = current_leader(std::slice::from_ref(ep), "c", within)
            .await
            .unwrap_err();
        let took = t.elapsed();
        assert!(took < within + Duration::from_millis(500), "{ep}: {took:?}");
        let msg = e.to_string();
        assert!(matches!(e, HaError::Unreachable { .. }), "{msg}");
        assert!(
            msg.contains(ep.as_str()) && msg.contains("is etcd running?"),
            "{msg}"
        );
    }

    let t = Instant::now();
    let e = campaign(std::slice::from_ref(&refused), "c", "a:1", TTL)
        .await
        .err()
        .expect("no etcd, no leadership");
    let took = t.elapsed();
    eprintln!("campaign against no etcd failed after {took:?}: {e}");
    assert!(
        took < ha::CONNECT_TIMEOUT + Duration::from_secs(1),
        "{took:?}"
    );
    assert!(matches!(e, HaError::Unreachable { .. }), "{e}");
}
