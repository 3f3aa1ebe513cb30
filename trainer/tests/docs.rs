//! Every `murmur-trainer` command the README and `docs/` show parses with the current command
//! line (the `murmur` suite checks its own commands and the links).

#[path = "../../e2e/support/docs.rs"]
mod docs;

use std::path::Path;

use clap::Parser;
use murmur_trainer::cli::Cli;

#[test]
fn every_trainer_command_in_the_readme_and_docs_parses() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut seen = 0;
    let mut bad = Vec::new();
    for page in docs::pages(workspace) {
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, words) in docs::commands(&text, "murmur-trainer") {
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
        seen >= 2,
        "only {seen} murmur-trainer commands found: is the scanner reading the pages?"
    );
    assert!(
        bad.is_empty(),
        "commands that do not parse:\n{}",
        bad.join("\n")
    );
}
