#![no_main]
// See murmur_core::fuzzing.
libfuzzer_sys::fuzz_target!(|input: &[u8]| murmur_core::fuzzing::control_request(input));
