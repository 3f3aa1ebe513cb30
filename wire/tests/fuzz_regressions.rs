//! Every input kept in fuzz/regressions/frame/ (crashes the fuzzer once found, and hand-made
//! hostile frames) runs through the same check as the `frame` fuzz target, on every test run.

#[test]
fn frames_that_once_broke_or_might_break_the_decoder() {
    assert!(murmur_core::fuzzing::replay_regressions("frame", murmur_wire::fuzzing::frames) > 0);
}
