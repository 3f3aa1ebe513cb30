#![no_main]
// See murmur_wire::fuzzing.
libfuzzer_sys::fuzz_target!(|input: &[u8]| murmur_wire::fuzzing::frames(input));
