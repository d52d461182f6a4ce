//! Payloads too large for a DynamoDB item, in S3 (the claim-check pattern):
//! stored, compressed when that helps, under a key derived from the event
//! key and the payload hash, before the record that refers to them is
//! claimed. The bucket's lifecycle rule expires them with the identities
//! (`RetentionDays` in the template).

use aws_sdk_s3::primitives::ByteStream;

use super::dynamodb::payload::{self, Stored};
use super::error_chain;
use crate::identity::{EventKey, payload_hash};
use crate::ledger::PortError;

/// Object metadata naming the stored body's encoding (`deflate`; absent: raw).
const ENCODING: &str = "hookledger-enc";

#[derive(Clone, Debug)]
pub struct S3Payloads {
    client: aws_sdk_s3::Client,
    bucket: String,
}

fn unavailable(e: impl std::error::Error) -> PortError {
    PortError::Unavailable { service: "s3", message: error_chain(&e) }
}

impl S3Payloads {
    pub fn new(client: aws_sdk_s3::Client, bucket: impl Into<String>) -> Self {
        Self { client, bucket: bucket.into() }
    }

    /// The bucket through the SDK configuration's endpoint and credentials.
    pub fn from_config(aws: &aws_config::SdkConfig, bucket: impl Into<String>) -> Self {
        Self::new(aws_sdk_s3::Client::new(aws), bucket)
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The object key of `key`'s payload `hash`: content-addressed, so a
    /// retried or repeated put writes the same object.
    pub fn object_key(key: &EventKey, hash: &str) -> String {
        format!("payloads/{}/{hash}", &payload_hash(key.as_str().as_bytes())[..32])
    }

    /// Stores a payload (idempotent: same key, same bytes).
    pub async fn put(&self, key: &EventKey, hash: &str, stored: &Stored) -> Result<(), PortError> {
        let mut req = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(Self::object_key(key, hash))
            .body(ByteStream::from(stored.bytes.clone()));
        if let Some(enc) = stored.encoding {
            req = req.metadata(ENCODING, enc);
        }
        req.send().await.map_err(unavailable)?;
        Ok(())
    }

    /// Deletes a payload's object (idempotent: none is not an error).
    pub async fn delete(&self, key: &EventKey, hash: &str) -> Result<(), PortError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(Self::object_key(key, hash))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// The payload, decoded; `None` when there is no such object.
    pub async fn get(&self, key: &EventKey, hash: &str) -> Result<Option<Vec<u8>>, PortError> {
        let out = match self.client.get_object().bucket(&self.bucket).key(Self::object_key(key, hash)).send().await {
            Ok(out) => out,
            Err(e) if e.as_service_error().is_some_and(|se| se.is_no_such_key()) => return Ok(None),
            Err(e) => return Err(unavailable(e)),
        };
        let encoding = out.metadata().and_then(|m| m.get(ENCODING)).cloned();
        let bytes = out.body.collect().await.map_err(unavailable)?.into_bytes().to_vec();
        Ok(payload::decode(&bytes, encoding.as_deref()))
    }
}

/// Creates the payload bucket if it does not exist (local stacks and tests;
/// the SAM template creates it in AWS, with its lifecycle rule).
pub async fn create_bucket(client: &aws_sdk_s3::Client, bucket: &str) -> Result<(), String> {
    match client.create_bucket().bucket(bucket).send().await {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|se| se.is_bucket_already_owned_by_you() || se.is_bucket_already_exists()) =>
        {
            Ok(())
        }
        Err(e) => Err(error_chain(&e)),
    }
}
