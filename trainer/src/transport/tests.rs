//! Transports on loopback, in one process: rounds, departures, skips, state transfer.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::frame::Reject;
use super::sessions::{skip_kind, skip_purpose};
use super::*;

const TIMEOUT: Duration = Duration::from_secs(5);

fn config(me: MemberId) -> TransportConfig {
    TransportConfig {
        job: frame::job_id("test", "ring"),
        me,
        key: b"a job key".to_vec(),
        layout_fingerprint: 77,
        max_message: 4 << 20,
        round_timeout: TIMEOUT,
    }
}

async fn members(n: u32) -> Vec<Transport> {
    let mut ts = Vec::new();
    for id in 0..n {
        ts.push(Transport::bind("127.0.0.1:0", config(id)).await.unwrap());
    }
    let addresses: BTreeMap<MemberId, String> = ts
        .iter()
        .map(|t| (t.me(), t.local_addr().to_string()))
        .collect();
    for t in &ts {
        t.set_topology(Agreements::all(1), addresses.clone());
    }
    ts
}

/// Every member sends `me` to each of `peers` and collects from them.
async fn round(t: &mut Transport, round: u64, peers: &[MemberId]) -> Vec<(MemberId, Vec<u8>)> {
    let me = t.me() as u8;
    let outgoing = peers
        .iter()
        .map(|&p| (p, crate::algorithms::Payload::new(vec![me; 3])))
        .collect();
    t.exchange(round, Purpose::Parameters, outgoing, peers)
        .await
        .into_iter()
        .map(|(from, payload)| (from, payload.to_vec()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_exchanges_every_round() {
    let ts = members(3).await;
    let mut handles = Vec::new();
    for mut t in ts {
        handles.push(tokio::spawn(async move {
            let me = t.me();
            let peers = vec![(me + 1) % 3, (me + 2) % 3];
            for r in 0..5 {
                let got = round(&mut t, r, &peers).await;
                let mut from: Vec<_> = got.iter().map(|(p, b)| (*p, b[0])).collect();
                from.sort();
                let expected: Vec<_> = {
                    let mut e: Vec<_> = peers.iter().map(|&p| (p, p as u8)).collect();
                    e.sort();
                    e
                };
                assert_eq!(from, expected, "member {me} round {r}");
            }
            assert!(t.take_drops().is_empty());
            assert_eq!(t.stats().rejected_total(), 0);
            t
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_peer_is_dropped_at_once_not_after_the_timeout() {
    let mut ts = members(3).await;
    let mut c = ts.pop().unwrap();
    let mut b = ts.pop().unwrap();
    let mut a = ts.pop().unwrap();
    let (ra, rb, rc) = tokio::join!(
        round(&mut a, 0, &[1, 2]),
        round(&mut b, 0, &[0]),
        round(&mut c, 0, &[0])
    );
    assert_eq!((ra.len(), rb.len(), rc.len()), (2, 1, 1));
    b.close(); // the process dies: its sockets close
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let (ra, rc) = tokio::join!(round(&mut a, 1, &[1, 2]), round(&mut c, 1, &[0]));
    assert_eq!(ra.iter().map(|(p, _)| *p).collect::<Vec<_>>(), vec![2]);
    assert_eq!(rc.len(), 1);
    assert!(started.elapsed() < TIMEOUT / 2, "{:?}", started.elapsed());
    let drops = a.take_drops();
    assert_eq!(drops.len(), 1);
    assert_eq!(
        (drops[0].peer, drops[0].reason),
        (1, DropReason::Disconnected)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_off_from_every_neighbour_waits_the_round_out() {
    let mut ts = members(2).await;
    let mut b = ts.pop().unwrap();
    let mut a = ts.pop().unwrap();
    let (ra, rb) = tokio::join!(round(&mut a, 0, &[1]), round(&mut b, 0, &[0]));
    assert_eq!((ra.len(), rb.len()), (1, 1));
    b.close();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Alone it would race ahead of the job; it waits for the neighbour or a repaired graph.
    let started = Instant::now();
    let got = round(&mut a, 1, &[1]).await;
    assert!(got.is_empty());
    assert!(started.elapsed() >= TIMEOUT, "{:?}", started.elapsed());
    let drops = a.take_drops();
    assert_eq!(drops.len(), 1);
    assert_eq!(drops[0].reason, DropReason::Disconnected);
}

/// An address nothing listens on: connections to it are refused.
async fn dead_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mid_job_a_neighbour_that_cannot_be_dialed_is_not_waited_for() {
    let mut ts = members(2).await;
    let mut b = ts.pop().unwrap();
    let mut a = ts.pop().unwrap();
    let (ra, rb) = tokio::join!(round(&mut a, 0, &[1]), round(&mut b, 0, &[0]));
    assert_eq!((ra.len(), rb.len()), (1, 1));
    // The topology now names member 2 too, at an address where no one listens (it finished
    // and exited before we met).
    let addresses: BTreeMap<MemberId, String> = [
        (0, a.local_addr().to_string()),
        (1, b.local_addr().to_string()),
        (2, dead_address().await),
    ]
    .into_iter()
    .collect();
    a.set_topology(Agreements::all(1), addresses);
    a.connect(&[2]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (ra, rb) = tokio::join!(round(&mut a, 1, &[1, 2]), round(&mut b, 1, &[0]));
    assert_eq!(ra.iter().map(|(p, _)| *p).collect::<Vec<_>>(), vec![1]);
    assert_eq!(rb.len(), 1);
    assert!(started.elapsed() < TIMEOUT / 2, "{:?}", started.elapsed());
    let drops = a.take_drops();
    assert_eq!(drops.len(), 1);
    assert_eq!(
        (drops[0].peer, drops[0].reason),
        (2, DropReason::Unreachable)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_peers_and_non_neighbours_do_not_cost_a_timeout() {
    let mut ts = members(3).await;
    let c = ts.pop().unwrap();
    let mut b = ts.pop().unwrap();
    let mut a = ts.pop().unwrap();
    // a counts b as a neighbour; b (another topology) does not count a, and answers "skip".
    let started = Instant::now();
    let (ra, rb) = tokio::join!(round(&mut a, 0, &[1]), round(&mut b, 0, &[]));
    assert!(ra.is_empty() && rb.is_empty());
    assert_eq!(a.take_drops()[0].reason, DropReason::Skipped);
    // c leaves; a, still counting on c, goes on at once.
    a.connect(&[2]);
    c.connect(&[0]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.leave(None, Duration::from_secs(1)).await;
    let got = round(&mut a, 1, &[2]).await;
    assert!(got.is_empty());
    assert_eq!(a.take_drops()[0].reason, DropReason::Left);
    assert!(started.elapsed() < TIMEOUT / 2, "{:?}", started.elapsed());
}

/// The end of a run: a neighbour finished first, told us, and exited. Our own leave has nothing
/// to wait for there (its listener is gone, so our last frames could never be written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_after_a_neighbour_left_and_exited_does_not_wait_out_the_window() {
    let mut ts = members(2).await;
    let mut b = ts.pop().unwrap();
    let mut a = ts.pop().unwrap();
    let (ra, rb) = tokio::join!(round(&mut a, 0, &[1]), round(&mut b, 0, &[0]));
    assert_eq!((ra.len(), rb.len()), (1, 1));
    b.leave(Some(40), TIMEOUT).await;
    b.close();
    drop(b);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A window far longer than the test's patience: leave must end on its own account.
    let left = tokio::time::timeout(TIMEOUT, a.leave(None, Duration::from_secs(3600))).await;
    assert!(left.is_ok(), "leave waited on a neighbour that had left");
}

/// A leave says the step the job ended at when that is why the peer leaves, and nothing when it
/// leaves mid-job (preempted, stopped): a member still short of the end ends on the first, and
/// trains on after the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_says_whether_the_job_ended() {
    let mut ts = members(3).await;
    let c = ts.pop().unwrap();
    let b = ts.pop().unwrap();
    let a = ts.pop().unwrap();
    b.connect(&[0]);
    c.connect(&[0]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.leave(None, TIMEOUT).await;
    wait_until(|| a.out_of_reach(1)).await;
    assert_eq!(a.job_ended(), None, "a leave mid-job is not the job's end");
    c.leave(Some(400), TIMEOUT).await;
    wait_until(|| a.job_ended().is_some()).await;
    assert_eq!(a.job_ended(), Some(400));
    // It holds once said, whoever comes back or leaves mid-job after.
    b.leave(None, TIMEOUT).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(a.job_ended(), Some(400));
}

async fn wait_until(done: impl Fn() -> bool) {
    let began = Instant::now();
    while !done() {
        assert!(began.elapsed() < TIMEOUT, "waited {TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A neighbour that died without a word (never said it left; its listener is gone): once our
/// dial to it fails, our leave has nothing to wait for there either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_when_a_neighbour_cannot_be_dialed_does_not_wait_out_the_window() {
    let mut ts = members(2).await;
    let b = ts.pop().unwrap();
    let a = ts.pop().unwrap();
    b.close();
    drop(b);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A joiner asks its neighbour for its state: that dial fails.
    assert!(a.request_state(1, 0));
    let left = tokio::time::timeout(TIMEOUT, a.leave(None, Duration::from_secs(3600))).await;
    assert!(
        left.is_ok(),
        "leave waited on a neighbour it could not dial"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_under_another_agreement_are_not_averaged() {
    let mut ts = members(2).await;
    let mut b = ts.pop().unwrap();
    let mut a = ts.pop().unwrap();
    let addresses: BTreeMap<MemberId, String> = [(0, a.local_addr()), (1, b.local_addr())]
        .into_iter()
        .map(|(id, addr)| (id, addr.to_string()))
        .collect();
    b.set_topology(Agreements::all(2), addresses);
    let (ra, rb) = tokio::join!(round(&mut a, 0, &[1]), round(&mut b, 0, &[0]));
    assert!(ra.is_empty() && rb.is_empty());
    assert_eq!(a.take_drops()[0].reason, DropReason::VersionMismatch);
    assert_eq!(b.take_drops()[0].reason, DropReason::VersionMismatch);
}

/// The first of what `take` drains from `at` once something arrives (`what`: named if nothing
/// does).
async fn first_arriving<T>(at: &Transport, take: impl Fn(&Transport) -> Vec<T>, what: &str) -> T {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(r) = take(at).pop() {
            return r;
        }
        assert!(Instant::now() < deadline, "no {what} arrived");
        at.changed(deadline).await;
    }
}

/// `joiner`, at `step`, asks `neighbour` for its state: the request as it reaches `neighbour`.
async fn state_request(joiner: &Transport, neighbour: &Transport, step: u64) -> StateRequest {
    assert!(joiner.request_state(neighbour.me(), step));
    first_arriving(neighbour, Transport::take_state_requests, "state request").await
}

/// The first state reply that reaches `joiner`.
async fn state_reply(joiner: &Transport) -> StateReply {
    first_arriving(joiner, Transport::take_state_replies, "state reply").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_member_fetches_state_from_a_neighbour() {
    let ts = members(2).await;
    let (a, b) = (ts[0].clone(), ts[1].clone());
    let request = state_request(&b, &a, 7).await;
    assert_eq!((request.from, request.step), (1, 7));
    let parameters: Vec<f32> = (0..300_000).map(|i| i as f32 * 0.5).collect();
    let optimizer = b"an optimizer record".to_vec();
    a.reply_state(request, 42, &parameters, &optimizer);
    let reply = state_reply(&b).await;
    assert_eq!((reply.from, reply.step, reply.agreement), (0, 42, 1));
    assert_eq!(reply.parameters, parameters);
    assert_eq!(reply.optimizer, optimizer);
}

/// An optimizer state too large for one message is left out, not the whole reply lost: the
/// joiner still gets the parameters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_reply_too_large_for_a_message_carries_the_parameters_alone() {
    let ts = members(2).await;
    let (a, b) = (ts[0].clone(), ts[1].clone());
    let request = state_request(&b, &a, 0).await;
    let parameters: Vec<f32> = (0..300_000).map(|i| i as f32).collect();
    // 1.2 MB of parameters and 3.6 MB of optimizer state: past the 4 MiB a message may hold.
    a.reply_state(request, 7, &parameters, &vec![1u8; 3_600_000]);
    let reply = state_reply(&b).await;
    assert_eq!((reply.step, reply.parameters.len()), (7, parameters.len()));
    assert!(reply.optimizer.is_empty());
}

#[test]
fn a_state_reply_whose_parameter_count_overruns_its_payload_is_refused() {
    let payload = StateReply::encode(&[1.0, 2.0], b"opt");
    assert_eq!(
        StateReply::decode(&payload),
        Some((vec![1.0, 2.0], b"opt".to_vec()))
    );
    assert_eq!(
        StateReply::decode(&StateReply::encode(&[], &[])),
        Some((vec![], vec![]))
    );
    let mut overrun = payload.clone();
    overrun[..8].copy_from_slice(&3u64.to_le_bytes());
    assert_eq!(StateReply::decode(&overrun), None);
    overrun[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(StateReply::decode(&overrun), None);
    assert_eq!(StateReply::decode(&payload[..5]), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_with_another_model_shape_are_refused() {
    let ts = members(1).await;
    let mut odd = config(5);
    odd.layout_fingerprint = 78;
    let other = Transport::bind("127.0.0.1:0", odd).await.unwrap();
    other.set_topology(
        Agreements::all(1),
        [(0, ts[0].local_addr().to_string())].into(),
    );
    other.connect(&[0]);
    let deadline = Instant::now() + TIMEOUT;
    while ts[0].stats().rejected_total() == 0 {
        assert!(
            Instant::now() < deadline,
            "the odd member was never refused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let shape = ts[0]
        .stats()
        .rejected()
        .into_iter()
        .find(|(r, _)| *r == Reject::ShapeMismatch)
        .unwrap();
    assert!(shape.1 >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_running_ahead_is_held_back_by_tcp_not_by_memory() {
    let mut ts = members(2).await;
    let b = ts.pop().unwrap();
    let mut a = ts.pop().unwrap();
    // Round 0 together, so `a` knows where it stands.
    let mut b0 = b.clone();
    let (ra, rb) = tokio::join!(round(&mut a, 0, &[1]), round(&mut b0, 0, &[0]));
    assert_eq!((ra.len(), rb.len()), (1, 1));
    // `b` races ahead with ten rounds of 1 KiB payloads; `a` stays at round 0.
    for r in 1..=10 {
        while !b.send(0, Kind::Parameters, r, vec![7; 1024]) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = a.shared.book.lock().held_bytes();
    assert_eq!(
        held,
        (book::WINDOW as usize + 1) * 1024,
        "rounds 1..=3 only"
    );
    // As `a` moves on, the rest flows in.
    for r in 1..=10 {
        let got = a.exchange(r, Purpose::Parameters, vec![], &[1]).await;
        assert_eq!(got.len(), 1, "round {r}");
    }
}

#[test]
fn each_purpose_has_its_own_payload_and_skip_kinds_and_maps_back() {
    let mut kinds = BTreeSet::new();
    for p in Purpose::ALL {
        assert_eq!(payload_purpose(payload_kind(p)), Some(p));
        assert_eq!(skip_purpose(skip_kind(p)), Some(p));
        assert_eq!(payload_purpose(skip_kind(p)), None);
        assert_eq!(skip_purpose(payload_kind(p)), None);
        assert!(kinds.insert(payload_kind(p)) && kinds.insert(skip_kind(p)));
    }
    for other in [
        Kind::Hello,
        Kind::Leave,
        Kind::StateRequest,
        Kind::StateReply,
    ] {
        assert_eq!((payload_purpose(other), skip_purpose(other)), (None, None));
    }
}

/// Collect from `t` until `want` letters have come, or the timeout.
async fn letters(t: &mut Transport, want: usize) -> Vec<(MemberId, Letter)> {
    let deadline = Instant::now() + TIMEOUT;
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < deadline {
        got.extend(t.collect());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    got
}

fn letter(kind: LetterKind, seq: u64, byte: u8) -> Letter {
    Letter {
        kind,
        seq,
        payload: Payload::new(vec![byte; 4]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_requests_are_answered_on_their_connection_and_a_dead_peer_costs_nothing() {
    let mut ts = members(3).await;
    // Member 2 is gone: its address is known, nobody listens there any more.
    ts.pop().unwrap().close();
    let (mut a, mut b) = (ts.remove(0), ts.remove(0));
    a.post(2, letter(LetterKind::Request, 1, 0xd));
    a.post(1, letter(LetterKind::Request, 7, 0xa));
    let got = letters(&mut b, 1).await;
    assert_eq!(got, vec![(0, letter(LetterKind::Request, 7, 0xa))]);
    b.post(0, letter(LetterKind::Reply, 7, 0xb));
    let got = letters(&mut a, 1).await;
    assert_eq!(got, vec![(1, letter(LetterKind::Reply, 7, 0xb))]);
    // A reply to a member that never asked goes nowhere; nothing waits for it.
    b.post(2, letter(LetterKind::Reply, 3, 0xc));
    // A newer request from the same peer replaces one not yet collected.
    a.post(1, letter(LetterKind::Request, 8, 1));
    a.post(1, letter(LetterKind::Request, 9, 2));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let got = letters(&mut b, 1).await;
    assert_eq!(got.last(), Some(&(0, letter(LetterKind::Request, 9, 2))));
    assert!(got.len() <= 2, "{got:?}");
    assert_eq!(a.stats().rejected_total() + b.stats().rejected_total(), 0);
}
