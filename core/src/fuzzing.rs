//! The checks the fuzz targets (`fuzz/`) run, shared with the regression tests that replay every
//! input that ever failed (`fuzz/regressions/`). Each returns normally or panics.

use crate::contract::{MemberView, TopologyDocument};

/// A manifest as `murmur run`, `murmur validate` and the operator read it: YAML, the CRD's
/// types, unknown fields, every CEL rule. What passes must pass again (the operator re-validates
/// what it reads back).
pub fn manifest(input: &[u8]) {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    if let Ok(job) = crate::api::parse_manifest(text, "fuzz.yaml") {
        crate::api::validate(&job).expect("a parsed manifest is valid");
    }
}

/// A topology document or a member's view as a trainer receives it: parsed, checked, and each
/// member's mixing row taken; a checked row sums to 1, and every view of a checked document
/// passes the view's own check.
pub fn topology_document(input: &[u8]) {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    if let Ok(doc) = TopologyDocument::parse(text) {
        for member in &doc.members {
            let (self_weight, row) = doc.mixing_row(member.id).expect("a member has a row");
            let total: f64 = self_weight + row.iter().map(|(_, w)| w).sum::<f64>();
            assert!(
                (total - 1.0).abs() <= 2.0 * crate::contract::document::ROW_SUM_TOLERANCE,
                "a checked row sums to 1: {total}"
            );
        }
        for view in crate::contract::view::views(&doc).values() {
            let total: f64 =
                view.self_weight + view.neighbours.iter().map(|n| n.weight).sum::<f64>();
            assert!(
                (total - 1.0).abs() <= 2.0 * crate::contract::document::ROW_SUM_TOLERANCE,
                "a view of a checked document sums to 1: {total}"
            );
            assert!(view.neighbours.windows(2).all(|w| w[0].id < w[1].id));
        }
    }
    if let Ok(view) = MemberView::parse(text) {
        let total: f64 = view.self_weight + view.neighbours.iter().map(|n| n.weight).sum::<f64>();
        assert!(
            view.outside
                || (total - 1.0).abs() <= 2.0 * crate::contract::document::ROW_SUM_TOLERANCE,
            "a checked view's row sums to 1: {total}"
        );
    }
}

/// The key the control-request target checks against: the fuzzer does not know it, as an
/// attacker on the network does not.
const JOB_KEY: &[u8] = b"the job key no input knows";

/// A trainer's request or a served topology as the control plane and trainers check them: the
/// input's first five lines are the method, path, attempt, sequence and time headers, the sixth
/// the signature, the rest the body. Nothing panics, a request not signed with the job key is
/// refused (naming the header or the signature), and so is a topology "signed" with the same
/// bytes; a request that is signed (re-signed here) verifies, and changing its body breaks it.
pub fn control_request(input: &[u8]) {
    use crate::contract::control;
    let mut parts = input.splitn(7, |&b| b == b'\n');
    let mut line = || {
        parts
            .next()
            .map(|l| String::from_utf8_lossy(l).into_owned())
    };
    let (method, path) = (line().unwrap_or_default(), line().unwrap_or_default());
    let headers = [
        (control::ATTEMPT_HEADER, line()),
        (control::SEQUENCE_HEADER, line()),
        (control::TIME_HEADER, line()),
        (control::SIGNATURE_HEADER, line()),
    ];
    let body = parts.next().unwrap_or_default();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.as_deref())
    };
    let checked = control::check_request(JOB_KEY, &method, &path, header, body);
    assert!(checked.is_err(), "an input the key never signed verified");
    let signature = header(control::SIGNATURE_HEADER).unwrap_or_default();
    assert!(!control::verify_topology(JOB_KEY, &path, body, signature));
    if let Ok(envelope) = control::Envelope::from_headers(header) {
        let signed = control::signed_headers(JOB_KEY, &method, &path, &envelope, body);
        let lookup = |name: &str| {
            signed
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            control::check_request(JOB_KEY, &method, &path, lookup, body),
            Ok(envelope)
        );
        let mut altered = body.to_vec();
        altered.push(b' ');
        assert!(control::check_request(JOB_KEY, &method, &path, lookup, &altered).is_err());
    }
}

/// Run `check` on every input kept in `fuzz/regressions/<target>/` (what the fuzzers once found
/// and hand-made hostile cases): a panicking input names its file. Returns how many ran. The
/// regression tests of each target call it, so they replay on every `cargo test`.
pub fn replay_regressions(target: &str, check: fn(&[u8])) -> usize {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/regressions")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let input = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&input));
        assert!(outcome.is_ok(), "{} panics", path.display());
        n += 1;
    }
    n
}

#[cfg(test)]
mod regressions {
    use super::replay_regressions as replay;

    #[test]
    fn manifests_that_broke_or_might_break_the_loader() {
        assert!(replay("manifest", super::manifest) > 0);
    }

    #[test]
    fn control_requests_that_might_pass_unsigned() {
        assert!(replay("control_request", super::control_request) > 0);
    }

    #[test]
    fn topology_documents_that_broke_or_might_break_the_parser() {
        assert!(replay("topology_document", super::topology_document) > 0);
    }
}
