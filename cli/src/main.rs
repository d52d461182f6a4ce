//! `hookledger`: developer and operator tool.
//!
//! - `setup`: creates the ledger table and work queue (idempotent), from the
//!   same definitions the tests use.
//! - `send`: signs a delivery for a configured endpoint exactly as its
//!   provider would and POSTs it, printing the HTTP answer.

mod send;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "hookledger", version, about = "Hookledger developer and operator tool")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the ledger table and the work queue if they do not exist; print the queue URL.
    Setup {
        #[arg(long, env = "HOOKLEDGER_TABLE")]
        table: String,
        #[arg(long, env = "HOOKLEDGER_QUEUE_NAME", default_value = "hookledger-work")]
        queue: String,
    },
    /// Sign a delivery for a configured endpoint and send it.
    Send(send::SendArgs),
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Setup { table, queue } => setup(&table, &queue).await,
        Command::Send(args) => send::run(args).await,
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn setup(table: &str, queue: &str) -> Result<(), String> {
    let aws = aws_config::load_from_env().await;
    hookledger::adapters::dynamodb::create_table(&aws_sdk_dynamodb::Client::new(&aws), table).await?;
    let url = hookledger::adapters::sqs::create_queue(&aws_sdk_sqs::Client::new(&aws), queue).await?;
    println!("{url}");
    Ok(())
}
