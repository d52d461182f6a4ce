//! `hookledger`: developer and operator tool. See `lib.rs` for the commands.

#[tokio::main]
async fn main() {
    let mut out = std::io::stdout();
    match hookledger_cli::run(std::env::args_os(), &mut out).await {
        Ok(()) => {}
        Err(hookledger_cli::CliError::Usage(e)) => e.exit(),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
