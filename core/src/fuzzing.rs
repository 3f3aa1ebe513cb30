//! The checks the fuzz targets (`fuzz/`) run, shared with the regression tests that replay every
//! input that ever failed (`fuzz/regressions/`). Each returns normally or panics.

use crate::contract::TopologyDocument;

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

/// A topology document as a trainer receives it: parsed, checked, and each member's mixing row
/// taken; a checked row sums to 1.
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
    fn topology_documents_that_broke_or_might_break_the_parser() {
        assert!(replay("topology_document", super::topology_document) > 0);
    }
}
