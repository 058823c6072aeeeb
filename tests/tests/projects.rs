//! Projects on one `cortex serve`: keys from a keys file (none on the
//! command line), two projects that cannot see each other's files, batches
//! or cached prompts, and an admin key that sees them all
//! (`tests/python/projects.py`, through the official `openai` client).

use std::path::Path;

use cortex_tests::{Cortex, Server, prompts, python_check};

#[test]
fn two_projects_see_only_their_own_and_an_admin_sees_all() {
    let cortex = Cortex::new();
    // A CLI job: the `default` project's, which only the admin lists.
    cortex.write("cli.jsonl", &prompts(2, 2));
    cortex.ok(&["submit", "cli.jsonl"]);
    let keys = cortex.write(
        "keys",
        "# key project [admin]\nsk-alpha-1 alpha\nsk-beta-1 beta\nsk-ops default admin\n",
    );
    let keys = keys.to_string_lossy().into_owned();
    let server = Server::start(&cortex, &["--keys-file", &keys, "--parallel", "8"]);
    let printed = python_check(
        "projects.py",
        &[
            Path::new(&server.url()),
            Path::new("sk-alpha-1"),
            Path::new("sk-beta-1"),
            Path::new("sk-ops"),
            cortex.dir(),
        ],
    );
    println!("{printed}");
    assert!(printed.contains("ALL CHECKS PASSED"), "{printed}");
}

#[test]
fn a_bad_keys_file_is_refused_naming_its_line() {
    let cortex = Cortex::new();
    let keys = cortex.write("keys", "sk-alpha-1 alpha\nsk-beta-1 be/ta\n");
    let keys = keys.to_string_lossy().into_owned();
    cortex.refused(
        &["serve", "--keys-file", &keys],
        &["keys:2", "project \"be/ta\" is not a project name"],
    );
    let twice = cortex.write("twice", "sk-same alpha\nsk-same beta\n");
    let twice = twice.to_string_lossy().into_owned();
    let refusal = cortex.refused(&["serve", "--keys-file", &twice], &["given twice"]);
    assert!(!refusal.contains("sk-same"), "a key was printed: {refusal}");
}
