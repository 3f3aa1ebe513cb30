//! Outside programs a test needs (ip, tc, iptables, chromium, go). A test whose programs are
//! missing says which, and how to install them, and passes — unless the variable named by
//! `require` is set (CI sets them), then a missing program fails it. The README lists them all
//! with the one command that installs them.

/// Whether every program of `tools` (name, Debian package) is on PATH. When one is missing:
/// panics if `require` is set in the environment, else prints why `test` is skipped and
/// returns false.
pub fn available(test: &str, tools: &[(&str, &str)], require: &str) -> bool {
    let missing: Vec<&(&str, &str)> = tools.iter().filter(|(name, _)| !on_path(name)).collect();
    if missing.is_empty() {
        return true;
    }
    let names: Vec<&str> = missing.iter().map(|(n, _)| *n).collect();
    let mut packages: Vec<&str> = missing.iter().map(|(_, p)| *p).collect();
    packages.dedup();
    let why = format!(
        "{test}: {} not on PATH (apt-get install {})",
        names.join(", "),
        packages.join(" ")
    );
    assert!(
        std::env::var_os(require).is_none(),
        "{require} is set, but {why}"
    );
    eprintln!("SKIPPED {why}");
    false
}

/// Whether `program` is an executable file in a PATH directory.
pub fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).any(|dir| {
        std::fs::metadata(dir.join(program))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// The headless browser on PATH, if any.
pub fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| on_path(name))
}

/// `browser` headless at `url` with `args` (`--dump-dom`, `--screenshot=...`): its stdout.
pub fn headless(browser: &str, args: &[&str], url: &str) -> String {
    let out = std::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--window-size=1400,1000",
            "--virtual-time-budget=4000",
        ])
        .args(args)
        .arg(url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
