//! Every input kept in fuzz/regressions/frame/ (crashes the fuzzer once found, and hand-made
//! hostile frames) runs through the same check as the `frame` fuzz target, on every test run.

use std::path::Path;

#[test]
fn frames_that_once_broke_or_might_break_the_decoder() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/frame");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let input = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| murmur_wire::fuzzing::frames(&input));
        assert!(outcome.is_ok(), "{} panics", path.display());
        n += 1;
    }
    assert!(n > 0);
}
