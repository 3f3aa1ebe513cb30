//! Reading the README and `docs/` as a checker: their relative links, and the commands their
//! shell blocks show, so that both stay true as the code moves. Shared by the `murmur` and
//! `murmur-trainer` test suites, each of which parses the commands of its own binary.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The README and every Markdown file under `docs/`, sorted.
pub fn pages(workspace: &Path) -> Vec<PathBuf> {
    let mut pages = vec![workspace.join("README.md")];
    let mut dirs = vec![workspace.join("docs")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// A link or command found on a page, with its line (1-based) for the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub line: usize,
    pub text: String,
}

/// The targets of inline Markdown links `[text](target)` outside code blocks and code spans.
pub fn links(markdown: &str) -> Vec<Found> {
    let mut found = Vec::new();
    let mut fenced = false;
    for (i, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            found.push(Found {
                line: i + 1,
                text: target.to_string(),
            });
            rest = &after[end..];
        }
    }
    found
}

fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_span = false;
    for c in line.chars() {
        if c == '`' {
            in_span = !in_span;
        } else if !in_span {
            out.push(c);
        }
    }
    out
}

/// Whether a link leaves the repository (checked by no one here).
pub fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// The anchors a page offers: GitHub's slug of each heading, numbered when repeated, and every
/// explicit `id="…"`.
pub fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("id=\"") {
            let after = &rest[at + 4..];
            let Some(end) = after.find('"') else { break };
            anchors.insert(after[..end].to_string());
            rest = &after[end..];
        }
        if let Some(heading) = line.strip_prefix('#') {
            let heading = heading.trim_start_matches('#').trim();
            let base = slug(heading);
            let mut candidate = base.clone();
            let mut n = 0;
            while anchors.contains(&candidate) {
                n += 1;
                candidate = format!("{base}-{n}");
            }
            anchors.insert(candidate);
        }
    }
    anchors
}

/// GitHub's heading slug: HTML tags dropped, lower case, punctuation other than `-` and `_`
/// dropped, spaces to `-`.
pub fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut in_tag = false;
    for c in heading.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            _ if !in_tag => text.push(c),
            _ => {}
        }
    }
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every relative link of every page that does not resolve: `page:line: target (why)`.
pub fn broken_links(workspace: &Path) -> Vec<String> {
    let mut broken = Vec::new();
    for page in pages(workspace) {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        let name = page.strip_prefix(workspace).unwrap().display().to_string();
        for link in links(&text) {
            if link.text.is_empty() || is_external(&link.text) {
                continue;
            }
            let (path, anchor) = match link.text.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (link.text.as_str(), None),
            };
            let target = if path.is_empty() {
                page.clone()
            } else {
                dir.join(path)
            };
            if !target.exists() {
                broken.push(format!(
                    "{name}:{}: {} (no such file)",
                    link.line, link.text
                ));
                continue;
            }
            if let Some(anchor) = anchor
                && target.extension().is_some_and(|e| e == "md")
            {
                let offered = anchors(&std::fs::read_to_string(&target).unwrap());
                if !offered.contains(anchor) {
                    broken.push(format!(
                        "{name}:{}: {} (no such anchor)",
                        link.line, link.text
                    ));
                }
            }
        }
    }
    broken
}

/// The commands of shell blocks (```sh, ```bash, ```shell, ```console) that run `program`:
/// continuation lines joined, a `$ ` prompt, environment assignments and a leading
/// `target/release/` or `./` dropped, and cut at the first pipe, redirection, `&&`, `;` or `&`.
/// Each comes back as its words, `program` first.
pub fn commands(markdown: &str, program: &str) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    let mut shell = false;
    let mut fenced = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in markdown.lines().enumerate() {
        let trimmed = raw.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            fenced = !fenced;
            shell = fenced && matches!(info.trim(), "sh" | "bash" | "shell" | "console");
            pending = None;
            continue;
        }
        if !shell {
            continue;
        }
        let (start, mut line) = match pending.take() {
            Some((start, before)) => (start, format!("{before} {trimmed}")),
            None => (i + 1, trimmed.to_string()),
        };
        if let Some(stripped) = line.strip_suffix('\\') {
            line = stripped.to_string();
            pending = Some((start, line));
            continue;
        }
        let line = line.strip_prefix("$ ").unwrap_or(&line).to_string();
        if line.starts_with('#') {
            continue;
        }
        for piece in line.split("&&").flat_map(|p| p.split(';')) {
            if let Some(words) = command_words(piece, program) {
                found.push((start, words));
            }
        }
    }
    found
}

/// Every `program` command of every page, checked with `parse` (its error, if it does not
/// parse): how many there are, and `page:line: command` with the error for each that fails.
pub fn unparsable(
    workspace: &Path,
    program: &str,
    parse: impl Fn(&[String]) -> Option<String>,
) -> (usize, Vec<String>) {
    let mut seen = 0;
    let mut bad = Vec::new();
    for page in pages(workspace) {
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, words) in commands(&text, program) {
            seen += 1;
            if let Some(error) = parse(&words) {
                bad.push(format!(
                    "{}:{line}: {}\n{error}",
                    page.display(),
                    words.join(" ")
                ));
            }
        }
    }
    (seen, bad)
}

/// What clap says of `words` as a command line of `P`, unless it parses (or asks for help).
pub fn clap_error<P: clap::Parser>(words: &[String]) -> Option<String> {
    use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
    P::try_parse_from(words)
        .err()
        .filter(|e| !matches!(e.kind(), DisplayHelp | DisplayVersion))
        .map(|e| e.to_string())
}

/// The words of one simple command if it runs `program`.
fn command_words(piece: &str, program: &str) -> Option<Vec<String>> {
    let piece = piece.split(['|', '>', '<', '&']).next().unwrap_or("");
    let words = split_words(piece)?;
    let mut words = words.into_iter().skip_while(|w| {
        w.contains('=') && !w.starts_with('-') && w.split('=').next().is_some_and(is_env_name)
    });
    let first = words.next()?;
    if first == "cargo" {
        // `cargo run -p <program> [--release] -- <args>`
        let rest: Vec<String> = words.collect();
        let names_program = rest
            .windows(2)
            .any(|w| matches!(w[0].as_str(), "-p" | "--package" | "--bin") && w[1] == program);
        let args = rest.iter().position(|w| w == "--")?;
        if rest.first().map(String::as_str) != Some("run") || !names_program {
            return None;
        }
        return Some(
            std::iter::once(program.to_string())
                .chain(rest[args + 1..].iter().cloned())
                .collect(),
        );
    }
    let name = first
        .strip_prefix("target/release/")
        .or_else(|| first.strip_prefix("target/debug/"))
        .or_else(|| first.strip_prefix("./"))
        .unwrap_or(&first);
    if name != program {
        return None;
    }
    Some(std::iter::once(program.to_string()).chain(words).collect())
}

fn is_env_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// Shell words with single and double quotes; `None` for an unterminated quote.
fn split_words(text: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return None;
    }
    if in_word {
        words.push(word);
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_outside_code_and_anchors_by_github_rules() {
        let md = "See [a](docs/a.md#x) and `[b](no.md)`.\n```sh\n[c](no.md)\n```\n## The `spec` — fields!\n## The `spec` — fields!\n<a id=\"spec.algorithm\"></a>";
        let found: Vec<String> = links(md).into_iter().map(|l| l.text).collect();
        assert_eq!(found, ["docs/a.md#x"]);
        let a = anchors(md);
        assert!(a.contains("the-spec--fields"), "{a:?}");
        assert!(a.contains("the-spec--fields-1"), "{a:?}");
        assert!(a.contains("spec.algorithm"), "{a:?}");
    }

    #[test]
    fn commands_are_cut_from_shell_blocks_as_a_shell_reads_them() {
        let md = "```sh\n# murmur in a comment\nMURMUR_X=1 target/release/murmur run \\\n  job.yaml --output 'out dir' | tee log\ncargo build && murmur validate a.yaml; murmur crd > c.yaml\ncargo run --release -p murmur -- topology --kind ring\n```\n```yaml\nmurmur run not-shell\n```";
        let found = commands(md, "murmur");
        assert_eq!(
            found,
            vec![
                (
                    3,
                    vec![
                        "murmur".into(),
                        "run".into(),
                        "job.yaml".into(),
                        "--output".into(),
                        "out dir".into()
                    ]
                ),
                (5, vec!["murmur".into(), "validate".into(), "a.yaml".into()]),
                (5, vec!["murmur".into(), "crd".into()]),
                (
                    6,
                    vec![
                        "murmur".into(),
                        "topology".into(),
                        "--kind".into(),
                        "ring".into()
                    ]
                ),
            ]
        );
        assert!(commands(md, "murmur-trainer").is_empty());
    }
}
