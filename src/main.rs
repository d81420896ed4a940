use clap::{Parser, Subcommand};

use canopy::config::{Config, LogFormat, ServeArgs};

/// Canopy: a Kafka-compatible ingestion broker.
#[derive(Parser)]
#[command(version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Start the broker (the default).
    Serve(ServeArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Serve(a)) => a,
        None => cli.serve,
    };
    let cfg = match Config::load(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("canopy: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    init_logging(cfg.log_format);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("canopy").build().expect("tokio runtime");
    match rt.block_on(run(cfg)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "canopy failed");
            eprintln!("canopy: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cfg: Config) -> anyhow::Result<()> {
    let running = canopy::server::start(cfg).await?;
    wait_for_signal().await;
    tracing::info!("shutting down");
    running.shutdown().await;
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
