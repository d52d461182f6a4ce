//! AWS implementations of the ports. Clients come from `aws_config`, so the
//! standard `AWS_ENDPOINT_URL*` variables point them at any endpoint. Beside
//! them, `memory` (the `testkit` feature) implements every port in memory
//! for the tests, on the DynamoDB adapter's own expressions.

#[cfg(feature = "cloudwatch")]
pub mod cloudwatch;
pub mod destinations;
pub mod dynamodb;
pub mod github;
pub mod handshake;
pub mod https;
#[cfg(any(test, feature = "testkit"))]
pub mod memory;
pub mod provider_http;
pub mod s3;
pub mod secrets;
pub mod sns;
pub mod sources;
pub mod sqs;
pub mod stripe;
pub mod timeouts;
pub mod tls;
pub mod webhooks;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;

use crate::ledger::PortError;
pub(crate) use crate::ledger::error_chain;

/// Maps an SDK error to a port error by its type/code, never by message text.
pub(crate) fn port_error<E>(service: &'static str, err: &aws_sdk_dynamodb::error::SdkError<E>) -> PortError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    use aws_sdk_dynamodb::error::SdkError;
    let code = match err {
        SdkError::ServiceError(e) => e.err().code().map(str::to_owned),
        _ => None,
    };
    match code.as_deref() {
        Some(
            "ProvisionedThroughputExceededException"
            | "ThrottlingException"
            | "RequestLimitExceeded"
            | "RequestThrottled"
            | "Throttling",
        ) => PortError::Throttled { service },
        Some(code) if crate::ledger::CALLER_CODES.contains(&code) => {
            PortError::Caller { service, code: code.to_owned(), message: error_chain(err) }
        }
        _ => PortError::Unavailable { service, message: error_chain(err) },
    }
}
