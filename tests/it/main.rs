#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Integration tests against the local AWS emulator (moto), through the real
//! aws-sdk clients. Run by `scripts/test`, which starts moto and sets
//! `AWS_ENDPOINT_URL`. One binary, so it builds once.

mod audit;
mod backfill;
mod bench;
mod browser;
mod chaos;
mod cli;
mod console;
mod contract;
mod cost;
mod deliveries;
mod explore;
mod fake_provider;
mod handler;
mod iam;
mod insight;
mod intake;
mod intake_faults;
mod large;
mod logs;
mod ops_faults;
mod privacy;
mod processor;
mod provider_audit;
mod queues;
mod quiltt;
mod race;
mod reconciler;
mod routes;
mod shards;
mod sqs_handler;
mod support;
mod sweep;
mod tenants;
mod upgrade;
mod webhook_sink;
