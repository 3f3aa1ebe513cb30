//! The README and `docs/` stay true: every relative link resolves, and every `murmur` command
//! they show parses with the current command line (`tests/cli.rs` checks the generated API
//! reference against the CRD).

#[path = "../../e2e/support/docs.rs"]
mod docs;

use std::path::{Path, PathBuf};

use murmur::cli::Cli;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let broken = docs::broken_links(&workspace());
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_murmur_command_in_the_readme_and_docs_parses() {
    let (seen, bad) = docs::unparsable(&workspace(), "murmur", docs::clap_error::<Cli>);
    assert!(
        seen >= 5,
        "only {seen} murmur commands found: is the scanner reading the pages?"
    );
    assert!(
        bad.is_empty(),
        "commands that do not parse:\n{}",
        bad.join("\n")
    );
}
