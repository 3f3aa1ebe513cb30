//! Every `murmur-trainer` command the README and `docs/` show parses with the current command
//! line (the `murmur` suite checks its own commands and the links).

#[path = "../../e2e/support/docs.rs"]
mod docs;

use std::path::Path;

use murmur_trainer::cli::Cli;

#[test]
fn every_trainer_command_in_the_readme_and_docs_parses() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let (seen, bad) = docs::unparsable(workspace, "murmur-trainer", docs::clap_error::<Cli>);
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
