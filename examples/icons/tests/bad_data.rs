//! Bad data is named: the icons trainer pointed at a folder that is not there exits with the
//! bad-input code and says which folder, on stderr and in its termination message (what the
//! operator puts in the member's failure and the job's `Failed` reason).

use std::process::Command;

#[test]
fn a_missing_icon_folder_is_named_in_the_error_and_the_termination_message() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("job.yaml");
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/job.yaml"))
        .unwrap()
        .replace("/usr/share/icons/oxygen/base/32x32", "/nonexistent/icons");
    std::fs::write(&manifest, text).unwrap();
    std::fs::write(
        dir.path().join("peer-key"),
        "0123456789abcdef0123456789abcdef\n",
    )
    .unwrap();
    let termination = dir.path().join("termination-log");
    let out = Command::new(env!("CARGO_BIN_EXE_icons-trainer"))
        .args(["run", "--manifest"])
        .arg(&manifest)
        .env("MURMUR_JOB", "icons")
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
    assert!(
        stderr.contains("/nonexistent/icons: cannot read"),
        "{stderr}"
    );
    let message = std::fs::read_to_string(&termination).unwrap();
    assert!(
        message.contains("\"failed\"") && message.contains("/nonexistent/icons"),
        "{message}"
    );
}
