//! Literal SQL: the writes of a transaction rendered as text, so that all
//! of them and the COMMIT travel in one simple-query round trip. Here the
//! literals and a lease record's columns; a flush's job writes are in
//! `job_writes.rs`.

use crate::core::LeaseRecord;
use crate::error::Field;
use crate::error::{Error, Result};
use crate::store::{holder_bytes, i64_of};

/// SQL text with literal values, for the writes of a flush: all of them,
/// and the COMMIT, travel in one simple-query round trip. Sessions run with
/// `standard_conforming_strings = on`, so inside `'...'` only the quote is
/// special (and doubled); bytes are hex; numbers are formatted by Rust. A
/// NUL (which the core never lets through, and PostgreSQL text cannot hold)
/// is refused rather than sent.
pub(super) struct Sql(pub String);

impl Sql {
    pub(super) fn raw(&mut self, text: &str) -> &mut Self {
        self.0.push_str(text);
        self
    }

    pub(super) fn text(&mut self, field: Field, text: &str) -> Result<&mut Self> {
        if text.contains('\0') {
            return Err(Error::invalid(field, "contains a NUL byte"));
        }
        self.0.reserve(text.len() + 2);
        self.0.push('\'');
        for c in text.chars() {
            if c == '\'' {
                self.0.push('\'');
            }
            self.0.push(c);
        }
        self.0.push('\'');
        Ok(self)
    }

    pub(super) fn opt_text(&mut self, field: Field, text: Option<&str>) -> Result<&mut Self> {
        match text {
            Some(t) => self.text(field, t),
            None => Ok(self.raw("NULL")),
        }
    }

    pub(super) fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        use std::fmt::Write;
        self.0.reserve(bytes.len() * 2 + 12);
        self.0.push_str("'\\x");
        for b in bytes {
            let _ = write!(self.0, "{b:02x}");
        }
        self.raw("'::bytea")
    }

    pub(super) fn int(&mut self, field: Field, v: u64) -> Result<&mut Self> {
        use std::fmt::Write;
        let _ = write!(self.0, "{}", i64_of(field, v)?);
        Ok(self)
    }

    pub(super) fn opt_int(&mut self, field: Field, v: Option<u64>) -> Result<&mut Self> {
        match v {
            Some(v) => self.int(field, v),
            None => Ok(self.raw("NULL")),
        }
    }

    /// A lease record's columns after its key: last token and slot arrays.
    pub(super) fn lease(&mut self, r: &LeaseRecord) -> Result<&mut Self> {
        self.int(Field::Token, r.last_token)?.raw(", ARRAY[");
        for (i, slot) in r.slots.iter().enumerate() {
            self.raw(if i == 0 { "" } else { ", " })
                .int(Field::Token, slot.token)?;
        }
        self.raw("]::int8[], ARRAY[");
        for (i, slot) in r.slots.iter().enumerate() {
            self.raw(if i == 0 { "" } else { ", " })
                .bytes(&holder_bytes(slot.holder.id));
        }
        self.raw("]::bytea[], ARRAY[");
        for (i, slot) in r.slots.iter().enumerate() {
            self.raw(if i == 0 { "" } else { ", " })
                .opt_text(Field::HolderLabel, slot.holder.label.as_deref())?;
        }
        self.raw("]::text[], ARRAY[");
        for (i, slot) in r.slots.iter().enumerate() {
            self.raw(if i == 0 { "" } else { ", " })
                .int(Field::ExpiresAt, slot.expires_at_ms)?;
        }
        Ok(self.raw(&format!("]::int8[], {}", r.limit)))
    }
}
