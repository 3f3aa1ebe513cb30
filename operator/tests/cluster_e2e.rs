//! The cluster e2e cannot run here (no container engine, no kind): what can be checked is that it
//! says exactly what is missing instead of failing half-way.

use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/cluster/run.sh")
}

fn which(program: &str) -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// A PATH holding only bash and dirname, plus fake tools (`name`, shell body).
fn path_with(dir: &Path, fakes: &[(&str, &str)]) -> String {
    std::fs::create_dir_all(dir).unwrap();
    for program in ["bash", "dirname"] {
        let link = dir.join(program);
        if !link.exists() {
            std::os::unix::fs::symlink(which(program), link).unwrap();
        }
    }
    for (name, body) in fakes {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        let mut perms = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms).unwrap();
    }
    dir.display().to_string()
}

fn run(path: &str, provider: Option<&str>) -> (i32, String) {
    let mut command = Command::new(which("bash"));
    command.arg(script()).env_clear().env("PATH", path);
    if let Some(p) = provider {
        command.env("MURMUR_E2E_CLUSTER", p);
    }
    let out = command.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn with_nothing_installed_it_names_every_missing_tool_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = path_with(dir.path(), &[]);
    let (code, stderr) = run(&path, None);
    assert_eq!(code, 3, "{stderr}");
    for tool in ["kind:", "helm:", "kubectl:", "docker:"] {
        assert!(stderr.contains(tool), "{tool} missing from: {stderr}");
    }
    let (_, stderr) = run(&path, Some("k3d"));
    assert!(stderr.contains("k3d:"), "{stderr}");
    let (code, stderr) = run(&path, Some("minikube"));
    assert_eq!(code, 2);
    assert!(stderr.contains("must be kind or k3d"), "{stderr}");
}

#[test]
fn a_docker_client_without_an_engine_is_called_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = path_with(
        dir.path(),
        &[
            ("kind", "exit 0"),
            ("helm", "exit 0"),
            ("kubectl", "exit 0"),
            (
                "docker",
                "echo 'Cannot connect to the Docker daemon' >&2; exit 1",
            ),
        ],
    );
    let (code, stderr) = run(&path, None);
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("a running Docker engine"), "{stderr}");
    assert!(!stderr.contains("helm:"), "{stderr}");
}
