//! The public API is chosen, not accumulated: every item reachable from the
//! crate root with the default features (each path it is reachable by, its
//! public fields, variants, methods and trait impls) is listed in
//! `api/leasehold.txt`, and this test fails when the crate's API differs
//! from that list, naming what was added and what removed. A deliberate
//! change updates the list: `UPDATE_API=1 cargo test --test public_api`.
//!
//! The list is read off rustdoc's JSON output (`RUSTC_BOOTSTRAP=1` lets the
//! stable toolchain write it); what rustdoc hides (`#[doc(hidden)]`: the
//! simulator's hooks, the adapters' internals) is not API.

#![allow(clippy::disallowed_methods)] // runs cargo and reads files

use serde_json::Value;
use std::collections::{BTreeSet, HashSet};
use std::path::Path;

fn kind(item: &Value) -> &str {
    item["inner"]
        .as_object()
        .and_then(|o| o.keys().next())
        .map_or("?", String::as_str)
}

struct Walk<'a> {
    index: &'a serde_json::Map<String, Value>,
    out: BTreeSet<String>,
    seen: HashSet<(String, String)>,
}

impl<'a> Walk<'a> {
    fn get(&self, id: &Value) -> Option<&'a Value> {
        let key = match id {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            _ => return None,
        };
        self.index.get(&key)
    }

    fn public(item: &Value) -> bool {
        item["visibility"] == "public"
    }

    fn item(&mut self, item: &'a Value, path: &str) {
        let k = kind(item);
        let inner = &item["inner"][k];
        if k == "module" {
            if !self.seen.insert((item["id"].to_string(), path.to_owned())) {
                return;
            }
            self.out.insert(format!("mod {path}"));
            for child in inner["items"].as_array().into_iter().flatten() {
                let Some(c) = self.get(child).filter(|c| Self::public(c)) else {
                    continue;
                };
                if kind(c) == "use" {
                    self.reexport(&c["inner"]["use"], path);
                } else if let Some(name) = c["name"].as_str() {
                    self.item(c, &format!("{path}::{name}"));
                }
            }
            return;
        }
        self.out.insert(format!("{k} {path}"));
        match k {
            "struct" => self.fields(&inner["kind"], path),
            "enum" => {
                for v in inner["variants"].as_array().into_iter().flatten() {
                    if let Some(name) = self.get(v).and_then(|v| v["name"].as_str()) {
                        self.out.insert(format!("variant {path}::{name}"));
                    }
                }
            }
            "trait" => {
                for m in inner["items"].as_array().into_iter().flatten() {
                    if let Some(name) = self.get(m).and_then(|m| m["name"].as_str()) {
                        self.out.insert(format!("trait-item {path}::{name}"));
                    }
                }
            }
            _ => {}
        }
        if matches!(k, "struct" | "enum" | "union") {
            self.impls(inner, path);
        }
    }

    fn reexport(&mut self, u: &'a Value, path: &str) {
        let name = u["name"].as_str().unwrap_or("?");
        let Some(target) = self.get(&u["id"]) else {
            self.out.insert(format!(
                "use {path}::{name} = {}",
                u["source"].as_str().unwrap_or("?")
            ));
            return;
        };
        if u["is_glob"] == true {
            for g in target["inner"]["module"]["items"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if let Some(gi) = self.get(g).filter(|g| Self::public(g)) {
                    if let Some(n) = gi["name"].as_str() {
                        self.item(gi, &format!("{path}::{n}"));
                    }
                }
            }
        } else {
            self.item(target, &format!("{path}::{name}"));
        }
    }

    fn fields(&mut self, kind: &Value, path: &str) {
        if let Some(fields) = kind["plain"]["fields"].as_array() {
            for f in fields {
                if let Some(fi) = self.get(f).filter(|f| Self::public(f)) {
                    let name = fi["name"].as_str().unwrap_or("?");
                    self.out.insert(format!("field {path}::{name}"));
                }
            }
        }
        if let Some(fields) = kind["tuple"].as_array() {
            for (n, f) in fields.iter().enumerate() {
                if self.get(f).is_some_and(Self::public) {
                    self.out.insert(format!("field {path}::{n}"));
                }
            }
        }
    }

    fn impls(&mut self, inner: &'a Value, path: &str) {
        for id in inner["impls"].as_array().into_iter().flatten() {
            let Some(imp) = self.get(id).map(|i| &i["inner"]["impl"]) else {
                continue;
            };
            if imp["is_synthetic"] == true || !imp["blanket_impl"].is_null() {
                continue;
            }
            if imp["trait"].is_null() {
                for m in imp["items"].as_array().into_iter().flatten() {
                    if let Some(mi) = self.get(m).filter(|m| Self::public(m)) {
                        let name = mi["name"].as_str().unwrap_or("?");
                        self.out.insert(format!("{} {path}::{name}", kind(mi)));
                    }
                }
            } else {
                let t = imp["trait"]["path"].as_str().unwrap_or("?");
                self.out.insert(format!("impl {t} for {path}"));
            }
        }
    }
}

fn current_api() -> BTreeSet<String> {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("public-api");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = std::process::Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUSTC_BOOTSTRAP", "1")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTDOCFLAGS")
        .args(["rustdoc", "-q", "-p", "leasehold", "--lib", "--target-dir"])
        .arg(&target)
        .args(["--", "-Z", "unstable-options", "--output-format", "json"])
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "rustdoc's JSON: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(target.join("doc/leasehold.json")).expect("the JSON");
    let doc: Value = serde_json::from_str(&text).expect("JSON");
    let index = doc["index"].as_object().expect("an index");
    let mut walk = Walk {
        index,
        out: BTreeSet::new(),
        seen: HashSet::new(),
    };
    let root = walk.get(&doc["root"]).expect("the root module");
    walk.item(root, "leasehold");
    walk.out
}

#[test]
fn the_public_api_is_the_one_checked_in() {
    let snapshot = Path::new(env!("CARGO_MANIFEST_DIR")).join("api/leasehold.txt");
    let now = current_api();
    assert!(
        now.iter().any(|l| l == "struct leasehold::Client")
            && now
                .iter()
                .any(|l| l == "function leasehold::Client::acquire"),
        "the walk reaches the client and its methods"
    );
    let text: String = now.iter().map(|l| format!("{l}\n")).collect();
    if std::env::var_os("UPDATE_API").is_some() {
        std::fs::create_dir_all(snapshot.parent().expect("api/")).expect("api/");
        std::fs::write(&snapshot, &text).expect("writing the snapshot");
        return;
    }
    let kept = std::fs::read_to_string(&snapshot).unwrap_or_default();
    let kept: BTreeSet<String> = kept.lines().map(str::to_owned).collect();
    let added: Vec<&String> = now.difference(&kept).collect();
    let removed: Vec<&String> = kept.difference(&now).collect();
    assert!(
        added.is_empty() && removed.is_empty(),
        "the public API changed; if on purpose, run `UPDATE_API=1 cargo test --test public_api` \
         and commit api/leasehold.txt\nadded:\n  {}\nremoved:\n  {}",
        added
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n  "),
        removed
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n  "),
    );
}
