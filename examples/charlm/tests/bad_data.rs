//! Bad data is named: the language-model trainer pointed at a text that is not UTF-8 exits with
//! the bad-input code and says which file and where, on stderr and in its termination message
//! (what the operator puts in the member's failure and the job's `Failed` reason).

use std::process::Command;

#[test]
fn a_file_that_is_not_utf8_is_named_with_its_offset_in_the_error_and_the_termination_message() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text");
    std::fs::create_dir(&text).unwrap();
    std::fs::write(text.join("a.txt"), "plain words ".repeat(200)).unwrap();
    std::fs::write(text.join("b.bin"), [b'o', b'k', 0xff, 0xfe]).unwrap();
    let manifest = dir.path().join("job.yaml");
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/job.yaml")).unwrap();
    assert_eq!(spec.matches("path: /usr/share/common-licenses}").count(), 1);
    let spec = spec.replace(
        "path: /usr/share/common-licenses}",
        &format!("path: {}}}", text.display()),
    );
    std::fs::write(&manifest, spec).unwrap();
    std::fs::write(
        dir.path().join("peer-key"),
        "0123456789abcdef0123456789abcdef\n",
    )
    .unwrap();
    let termination = dir.path().join("termination-log");
    let out = Command::new(env!("CARGO_BIN_EXE_charlm-trainer"))
        .args(["run", "--manifest"])
        .arg(&manifest)
        .env("MURMUR_JOB", "charlm")
        .env("MURMUR_NAMESPACE", "test")
        .env("MURMUR_MEMBER_ID", "0")
        .env("MURMUR_LISTEN_ADDRESS", "127.0.0.1:0")
        .env("MURMUR_STATUS_ADDRESS", "127.0.0.1:0")
        .env("MURMUR_PEER_KEY_FILE", dir.path().join("peer-key"))
        .env("MURMUR_TOPOLOGY_FILE", dir.path().join("topology.json"))
        .env("MURMUR_TERMINATION_LOG", &termination)
        .env_remove("MURMUR_CONTROL_ENDPOINT")
        .env_remove("MURMUR_JOB_SPEC")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let named = format!("{}: not UTF-8 text (byte 2)", text.join("b.bin").display());
    assert!(stderr.contains(&named), "{stderr}");
    let message = std::fs::read_to_string(&termination).unwrap();
    assert!(
        message.contains("\"failed\"") && message.contains("b.bin"),
        "{message}"
    );
}
