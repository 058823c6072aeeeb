//! HTTP conformance with Schemathesis: it reads the OpenAPI document that
//! `cortex serve` publishes at `/openapi.json` and sends every route
//! requests made from it (valid and invalid: wrong types, missing fields,
//! odd path ids, other methods and content types), checking that no answer
//! is a server error and that every answer's status, content type and body
//! are the ones the document declares. Run on a server without keys (the
//! loopback default) and on one with a key.

use std::process::Command;

use cortex_tests::{Cortex, Server, python};

/// Runs Schemathesis against `server`, with `headers`; panics with its report on a failure.
fn schemathesis(cortex: &Cortex, server: &Server, headers: &[&str]) {
    let bin = python().with_file_name("schemathesis");
    let mut command = Command::new(&bin);
    command
        .current_dir(cortex.dir())
        .arg("run")
        .arg(format!("{}/openapi.json", server.url()))
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            "20",
            "--workers",
            "1",
            "--request-timeout",
            "120",
            "--seed",
            "20261124",
        ]);
    for header in headers {
        command.args(["--header", header]);
    }
    let output = command.output().expect("run schemathesis");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{report}");
    assert!(output.status.success(), "Schemathesis failed:\n{report}");
    assert!(
        report.contains("Tested: 47"),
        "not every route was tested:\n{report}"
    );
}

#[test]
fn every_route_conforms_to_the_published_openapi_document() {
    let mut cortex = Cortex::new();
    // Generated requests create, copy and delete models: on a registry of its own.
    cortex.private_models();
    // Generations are short, so the fuzzing takes seconds per route; a
    // larger ask is a (documented) 400.
    let server = Server::start(&cortex, &["--max-request-tokens", "64"]);
    schemathesis(&cortex, &server, &[]);
    drop(server);

    let mut keyed = Cortex::new();
    keyed.private_models();
    keyed.set_env("CORTEX_API_KEYS", "sk-conformance");
    let server = Server::start(&keyed, &["--max-request-tokens", "64"]);
    schemathesis(&keyed, &server, &["Authorization: Bearer sk-conformance"]);
}
