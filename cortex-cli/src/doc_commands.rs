//! Every `cortex` command shown in the README and the book (`docs/`) parses
//! as the binary parses it, so the examples cannot drift from the flags.

use std::path::{Path, PathBuf};

use clap::Parser as _;

use crate::cli::Cli;

/// The lines of the ```sh blocks of a Markdown text, a `\` continuation
/// joined to the next line, each with the line number where it starts.
fn shell_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_shell = false;
    let mut pending: Option<(usize, String)> = None;
    for (index, line) in text.lines().enumerate() {
        let fence = line.trim_start();
        if fence.starts_with("```") {
            in_shell =
                !in_shell && matches!(fence.trim_start_matches('`'), "sh" | "bash" | "shell");
            continue;
        }
        if !in_shell {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((index + 1, String::new()));
        match line.strip_suffix('\\') {
            Some(head) => {
                joined.push_str(head);
                pending = Some((start, joined));
            }
            None => {
                joined.push_str(line);
                out.push((start, joined));
            }
        }
    }
    out
}

/// A shell line cut into words as a POSIX shell would (quotes, `\`
/// escapes), stopping at a comment; `;`, `|` and `&&` end a command and
/// come back as words of their own.
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let text = word.get_or_insert_with(String::new);
                text.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                let text = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => text.extend(chars.next()),
                        c => text.push(c),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            '#' if word.is_none() => break,
            ';' | '|' | '&' => {
                words.extend(word.take());
                if c == '&' && chars.peek() == Some(&'&') {
                    chars.next();
                }
                words.push(";".into());
            }
            c if c.is_whitespace() => words.extend(word.take()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// The `cortex` commands of a shell line: each command's words after
/// its `VAR=value` assignments, when its program is `cortex`.
fn cortex_commands(line: &str) -> Vec<Vec<String>> {
    words(line)
        .split(|word| word == ";")
        .filter_map(|command| {
            let start = command.iter().position(|w| !is_assignment(w))?;
            (command[start] == "cortex").then(|| command[start..].to_vec())
        })
        .collect()
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

/// The README and every chapter of the book.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md")];
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    chapters.sort();
    files.extend(chapters);
    files
}

#[test]
fn shell_words_are_cut_as_a_shell_cuts_them() {
    assert_eq!(
        cortex_commands("A=1 cortex run 'x y.jsonl' --system \"Be \\\"brief\\\"\" # comment"),
        [["cortex", "run", "x y.jsonl", "--system", "Be \"brief\""]]
    );
    assert_eq!(
        cortex_commands("cortex status; cortex results 1 | head"),
        [vec!["cortex", "status"], vec!["cortex", "results", "1"]]
    );
    assert!(cortex_commands("cargo bench -p cortex-sample").is_empty());
    let joined = shell_lines("```sh\ncortex run a \\\n  --force\n```\n");
    assert_eq!(joined, [(2, "cortex run a   --force".to_owned())]);
}

#[test]
fn every_documented_command_parses() {
    let mut checked = 0;
    let mut wrong = Vec::new();
    for file in documents() {
        let text = std::fs::read_to_string(&file).expect("a document");
        for (line, shell) in shell_lines(&text) {
            for command in cortex_commands(&shell) {
                checked += 1;
                let parsed = Cli::try_parse_from(&command);
                let error = match parsed {
                    Ok(cli) => crate::setting_flags(&cli).err(),
                    Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp) => None,
                    Err(e) => Some(e),
                };
                if let Some(error) = error {
                    let first = error
                        .to_string()
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_owned();
                    wrong.push(format!(
                        "{}:{line}: {}: {first}",
                        file.display(),
                        command.join(" ")
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "commands that do not parse:\n{}",
        wrong.join("\n")
    );
    assert!(checked > 40, "only {checked} documented commands found");
}
