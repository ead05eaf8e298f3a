//! Typed payloads and results (cargo feature `serde`): any `Serialize`
//! value goes in as JSON, any `Deserialize` type comes back out. The store
//! keeps bytes; these are conveniences over [`JobSpec::payload`],
//! [`JobRecord::payload`] and job results, with the same size limits and
//! typed errors ([`Error::Invalid`] naming `payload` or `result`).
//!
//! ```
//! use leasehold::{Client, JobSpec, MemStore, WorkOptions};
//! use serde::{Deserialize, Serialize};
//! use std::sync::atomic::AtomicBool;
//!
//! #[derive(Serialize, Deserialize)]
//! struct Email { to: String, subject: String }
//! #[derive(Serialize, Deserialize, Debug, PartialEq)]
//! struct Sent { message_id: u64 }
//!
//! let client = Client::new(MemStore::new());
//! let queue = client.queue("email")?;
//! let id = queue.push(&JobSpec::json(&Email { to: "a@b.c".into(), subject: "hi".into() })?)?.id;
//! let opts = WorkOptions { drain: true, ..WorkOptions::default() };
//! queue.work(&opts, &AtomicBool::new(false), |job| {
//!     let email: Email = job.payload_json().map_err(|e| e.to_string())?;
//!     assert_eq!(email.to, "a@b.c");
//!     job.set_result_json(&Sent { message_id: 7 }).map_err(|e| e.to_string())
//! })?;
//! let sent: Option<Sent> = queue.get(id)?.result_json()?;
//! assert_eq!(sent, Some(Sent { message_id: 7 }));
//! # Ok::<(), leasehold::Error>(())
//! ```

use crate::core::{JobRecord, JobSpec};
use crate::error::Field;
use crate::error::{Error, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;

fn encode(field: Field, value: &impl Serialize) -> Result<Vec<u8>> {
    serde_json::to_vec(value)
        .map_err(|e| Error::invalid(field, format!("cannot be written as JSON: {e}")))
}

fn decode<T: DeserializeOwned>(field: Field, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| {
        Error::invalid(
            field,
            format!("is not JSON for {}: {e}", std::any::type_name::<T>()),
        )
    })
}

impl JobSpec {
    /// A job whose payload is `value` as JSON, with default options.
    pub fn json(value: &impl Serialize) -> Result<JobSpec> {
        Ok(JobSpec::new(encode(Field::Payload, value)?))
    }
}

impl JobRecord {
    /// The payload, read as JSON for `T`.
    pub fn payload_json<T: DeserializeOwned>(&self) -> Result<T> {
        decode(Field::Payload, &self.payload)
    }

    /// The result the job completed with, read as JSON for `T` (`None`
    /// when it has none).
    pub fn result_json<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        self.result
            .as_deref()
            .map(|r| decode(Field::Result, r))
            .transpose()
    }
}

impl crate::ClaimedJob {
    /// The payload, read as JSON for `T`.
    pub fn payload_json<T: DeserializeOwned>(&self) -> Result<T> {
        self.record().payload_json()
    }

    /// [`crate::ClaimedJob::set_result`] with `value` as JSON.
    pub fn set_result_json(&self, value: &impl Serialize) -> Result<()> {
        self.set_result(encode(Field::Result, value)?)
    }

    /// [`crate::ClaimedJob::complete_with`] with `value` as JSON.
    pub fn complete_json(&self, value: &impl Serialize) -> Result<()> {
        self.complete_with(&encode(Field::Result, value)?)
    }
}

#[cfg(all(feature = "tokio", not(loom)))]
impl crate::tokio::ClaimedJob {
    /// The payload, read as JSON for `T`.
    pub fn payload_json<T: DeserializeOwned>(&self) -> Result<T> {
        self.record().payload_json()
    }

    /// [`crate::tokio::ClaimedJob::set_result`] with `value` as JSON.
    pub fn set_result_json(&self, value: &impl Serialize) -> Result<()> {
        self.set_result(encode(Field::Result, value)?)
    }

    /// [`crate::tokio::ClaimedJob::complete_with`] with `value` as JSON.
    pub async fn complete_json(&self, value: &impl Serialize) -> Result<()> {
        self.complete_with(&encode(Field::Result, value)?).await
    }
}
