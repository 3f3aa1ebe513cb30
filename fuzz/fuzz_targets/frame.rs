#![no_main]
// See murmur_trainer::transport::fuzzing.
libfuzzer_sys::fuzz_target!(|input: &[u8]| murmur_trainer::transport::fuzzing::frames(input));
