//! The README and the book: every link resolves, to a file or a heading.

use super::*;

/// The anchor a Markdown heading gets (GitHub's and mdBook's rule):
/// lowercase, spaces to `-`, everything but letters, digits, `-` and `_` dropped.
fn heading_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// A Markdown text's lines outside its fenced code blocks.
fn prose_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut in_code = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            return false;
        }
        !in_code
    })
}

/// The anchors of a Markdown file's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    prose_lines(text)
        .filter(|line| line.starts_with('#'))
        .map(|line| heading_anchor(line.trim_start_matches('#')))
        .collect()
}

/// The targets of a Markdown text's inline links and images.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose_lines(text) {
        // Inline code spans hold no links.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn the_readme_and_the_book_link_only_to_what_exists() {
    let root = workspace_root();
    let mut documents = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    chapters.sort();
    documents.extend(chapters.iter().cloned());
    let mut broken = Vec::new();
    for document in &documents {
        let text = std::fs::read_to_string(document).unwrap();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() {
                document.clone()
            } else {
                document.parent().unwrap().join(path)
            };
            if !file.exists() {
                broken.push(format!("{}: {target}: no such file", document.display()));
            } else if !anchor.is_empty() {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&text).contains(anchor) {
                    broken.push(format!("{}: {target}: no such heading", document.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    // Every chapter is in the book's table of contents.
    let summary = std::fs::read_to_string(root.join("docs/SUMMARY.md")).unwrap();
    let listed: BTreeSet<String> = link_targets(&summary).into_iter().collect();
    for chapter in &chapters {
        let name = chapter.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name == "SUMMARY.md" || listed.contains(&name),
            "docs/{name} is not in docs/SUMMARY.md, so the book leaves it out"
        );
    }
    // The README is a landing page; the rest is the book's.
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.lines().count() <= 200,
        "README.md has {} lines: move detail into the book (docs/)",
        readme.lines().count()
    );
}

#[test]
fn headings_become_the_anchors_links_use() {
    assert_eq!(
        heading_anchor(" Settings and exit codes"),
        "settings-and-exit-codes"
    );
    assert_eq!(
        heading_anchor(" Tools, reasoning and a line's model"),
        "tools-reasoning-and-a-lines-model"
    );
    assert_eq!(link_targets("see [a](b.md#c) and `[x](y)`"), ["b.md#c"]);
}
