//! PostgreSQL over TLS (`sslmode`, `sslrootcert`), against the server in
//! `LEASEHOLD_TEST_PG` and the certificate `.ci/run` installs (its CA in
//! `LEASEHOLD_TEST_PG_TLS_CA`); each test skips with a notice when a
//! variable it needs is unset.

#![allow(clippy::disallowed_methods)] // real time, real threads

#[path = "support/pg.rs"]
mod pg;

use leasehold::core;
use leasehold::{Error, PostgresStore, Store, StoreExt, StoreFailure};
use pg::{admin, Schema};

/// How many sessions the server has for `app`, and whether all are encrypted.
fn sessions_of(app: &str) -> (i64, bool) {
    let rows = admin(&format!(
        "SELECT count(*), coalesce(bool_and(s.ssl), false)
           FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = '{app}'"
    ));
    (rows[0].get(0), rows[0].get(1))
}

/// Open `url` (with an application_name of its own), run a transaction,
/// and report its sessions as [`sessions_of`] does.
fn open_and_look(url: &str, tag: &str) -> Result<(i64, bool), Error> {
    let app = format!("lh_tls_{tag}_{}", std::process::id());
    let store = PostgresStore::open(&format!("{url}&application_name={app}"))?;
    store.txn(|tx| core::lease::inspect(tx, "k"))?;
    Ok(sessions_of(&app))
}

#[test]
fn sslmode_require_and_prefer_encrypt_every_session_and_no_sslmode_stays_plain() {
    if pg::tls_ca().is_none() {
        return;
    }
    let schema = Schema::new("tls");
    for (params, tag, encrypted) in [
        ("sslmode=require", "require", true),
        ("sslmode=prefer", "prefer", true),
        ("sslmode=disable", "disable", false),
        ("", "none", false),
    ] {
        let url = format!("{}&{params}", schema.url());
        assert_eq!(
            open_and_look(&url, tag).unwrap(),
            (1, encrypted),
            "{params:?}: one pooled session, encrypted or not"
        );
    }
    let shown = PostgresStore::open(&format!("{}&sslmode=require", schema.url()))
        .unwrap()
        .describe();
    assert!(shown.contains("sslmode=require"), "{shown}");
}

#[test]
fn verify_full_and_verify_ca_with_the_right_ca_connect_by_address_and_by_name() {
    let Some(ca) = pg::tls_ca() else { return };
    let schema = Schema::new("tlsok");
    let root = format!("sslrootcert={}", ca.display());
    for mode in ["verify-full", "verify-ca"] {
        let params = format!("sslmode={mode}&{root}");
        let by_address = format!("{}&{params}", schema.url());
        assert_eq!(
            open_and_look(&by_address, "addr").unwrap(),
            (1, true),
            "{mode}"
        );
        let by_name = pg::url_as_host("localhost", &schema, &params);
        assert_eq!(
            open_and_look(&by_name, "name").unwrap(),
            (1, true),
            "{mode}"
        );
    }
}

/// A store error that is permanent (retrying cannot help) and names `cause`.
fn assert_refused(result: Result<(i64, bool), Error>, cause: &str, what: &str) {
    match result {
        Err(e @ Error::Store { failure, .. }) => {
            assert_eq!(failure, StoreFailure::Permanent, "{what}: {e}");
            let text = e.to_string();
            assert!(text.contains(cause), "{what}: {text}");
        }
        other => panic!("{what}: expected a refused handshake, got {other:?}"),
    }
}

#[test]
fn a_server_certificate_from_an_untrusted_ca_is_refused_naming_the_cause() {
    let Some(ca) = pg::tls_ca() else { return };
    let untrusted = ca.with_file_name("untrusted-ca.pem");
    assert!(
        untrusted.exists(),
        "{} (made by .ci/run)",
        untrusted.display()
    );
    let schema = Schema::new("tlsca");
    // `require` with a root certificate checks the chain too (as libpq).
    for mode in ["verify-full", "verify-ca", "require"] {
        let url = format!(
            "{}&sslmode={mode}&sslrootcert={}",
            schema.url(),
            untrusted.display()
        );
        assert_refused(
            open_and_look(&url, "untrusted"),
            "not signed by a CA in sslrootcert",
            mode,
        );
    }
}

#[test]
fn a_host_the_certificate_does_not_name_is_refused_under_verify_full_only() {
    let Some(ca) = pg::tls_ca() else { return };
    let schema = Schema::new("tlshost");
    let root = format!("sslrootcert={}", ca.display());
    let full = pg::url_as_host(
        "wrong-host.invalid",
        &schema,
        &format!("sslmode=verify-full&{root}"),
    );
    assert_refused(
        open_and_look(&full, "wronghost"),
        "does not name the host",
        "verify-full",
    );
    let chain = pg::url_as_host(
        "wrong-host.invalid",
        &schema,
        &format!("sslmode=verify-ca&{root}"),
    );
    assert_eq!(
        open_and_look(&chain, "wrongca").unwrap(),
        (1, true),
        "verify-ca"
    );
}

/// Needs no server: every one is refused before connecting.
#[test]
fn tls_parameters_that_cannot_work_are_refused_before_connecting() {
    let base = "postgres://postgres@127.0.0.1:1/nowhere?schema=x";
    let not_pem = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    for (params, field, says) in [
        ("sslmode=bogus", "sslmode", "verify-full"),
        ("sslmode=verify-full", "sslrootcert", "needs sslrootcert"),
        ("sslmode=verify-ca", "sslrootcert", "needs sslrootcert"),
        (
            "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            "sslrootcert",
            "/nonexistent/ca.pem",
        ),
        (
            &format!("sslmode=verify-full&sslrootcert={not_pem}"),
            "sslrootcert",
            "no PEM certificate",
        ),
        ("sslrootcert=/etc/ca.pem", "sslrootcert", "no sslmode"),
        (
            "sslmode=disable&sslrootcert=/etc/ca.pem",
            "sslrootcert",
            "sslmode=disable",
        ),
        ("sslmode=require&sslrootcert=%zz", "sslrootcert", "%-escape"),
    ] {
        match PostgresStore::open(&format!("{base}&{params}")) {
            Err(Error::Invalid { field: f, reason }) => {
                assert_eq!(f.as_str(), field, "{params}: {reason}");
                assert!(reason.contains(says), "{params}: {reason}");
            }
            other => panic!("{params}: expected an invalid {field}, got {other:?}"),
        }
    }
}
