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
    /// Compare the adaptive split plan with the prefix3 baseline for a data
    /// directory (stop the broker first) or a CSV of `topic,bytes`: prints
    /// the four numbers side by side and writes an HTML page of both plans.
    SplitReport(SplitReportArgs),
    /// Set a user's SCRAM password in a stopped broker's data directory
    /// (how the first users, and the super users' own credentials, are
    /// made; later ones can be made with AlterUserScramCredentials).
    User(UserArgs),
}

#[derive(clap::Args)]
struct UserArgs {
    /// The broker's data directory (the broker must not be running on it).
    #[arg(long)]
    data_dir: std::path::PathBuf,
    /// The user name (the principal is `User:<name>`).
    #[arg(long)]
    name: String,
    /// A file holding the password (its first line); `-` reads standard
    /// input. Never given on the command line, where `ps` shows it.
    #[arg(long)]
    password_file: String,
    /// SCRAM mechanisms to store a credential for (PLAIN checks against
    /// the strongest).
    #[arg(long, value_delimiter = ',', default_value = "SCRAM-SHA-256,SCRAM-SHA-512")]
    mechanisms: Vec<String>,
    /// PBKDF2 iterations (Kafka accepts 4096 to 16384).
    #[arg(long, default_value_t = 8192)]
    iterations: u32,
}

fn set_user(a: UserArgs) -> Result<(), String> {
    use canopy::auth::scram::{Mechanism, MAX_ITERATIONS, MIN_ITERATIONS};
    let mechanisms = a.mechanisms.iter().map(|m| Mechanism::from_name(m.trim()).ok_or_else(|| format!("{m:?} is not SCRAM-SHA-256 or SCRAM-SHA-512"))).collect::<Result<Vec<_>, _>>()?;
    if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&a.iterations) {
        return Err(format!("--iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}"));
    }
    let text = if a.password_file == "-" {
        let mut s = String::new();
        std::io::stdin().read_line(&mut s).map_err(|e| format!("reading the password: {e}"))?;
        s
    } else {
        std::fs::read_to_string(&a.password_file).map_err(|e| format!("{}: {e}", a.password_file))?
    };
    let password = text.lines().next().unwrap_or("");
    if password.is_empty() {
        return Err("the password is empty".into());
    }
    canopy::auth::users::set_password(&a.data_dir, &a.name, password.as_bytes(), &mechanisms, a.iterations)?;
    eprintln!("set {} credentials of User:{}", mechanisms.iter().map(|m| m.name()).collect::<Vec<_>>().join(" and "), a.name);
    Ok(())
}

#[derive(clap::Args)]
struct SplitReportArgs {
    /// A Canopy data directory (the broker must not be running on it).
    #[arg(long, conflicts_with = "csv", required_unless_present = "csv")]
    data_dir: Option<std::path::PathBuf>,
    /// A CSV file of `topic,bytes` lines.
    #[arg(long)]
    csv: Option<std::path::PathBuf>,
    /// Adaptive plan: at most this many stores (default: as many as prefix3 makes).
    #[arg(long)]
    max_stores: Option<usize>,
    /// Adaptive plan: no store below this size but the last.
    #[arg(long, default_value_t = 0)]
    min_store_bytes: u64,
    /// Where to write the HTML page.
    #[arg(long, default_value = "split-report.html")]
    html: std::path::PathBuf,
    /// `text` (the numbers) or `json` (the plans, every topic to its store, with the numbers).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    format: String,
}

fn split_report(a: SplitReportArgs) -> Result<(), String> {
    use canopy::storage::subtree;
    let (topics, title) = match (&a.data_dir, &a.csv) {
        (_, Some(csv)) => {
            let text = std::fs::read_to_string(csv).map_err(|e| format!("{}: {e}", csv.display()))?;
            (subtree::report::parse_csv(&text).map_err(|e| format!("{}: {e}", csv.display()))?, csv.display().to_string())
        }
        (Some(dir), None) => {
            let catalog = canopy::meta::Catalog::open(&dir.join("catalog")).map_err(|e| format!("{e} (is a broker running on {}?)", dir.display()))?;
            let names: std::collections::HashMap<[u8; 16], String> = catalog.topics().map_err(|e| e.to_string())?.into_iter().map(|t| (t.id, t.name)).collect();
            let windows = catalog.windows().map_err(|e| e.to_string())?;
            let volumes = subtree::volumes(dir, &windows)?;
            (volumes.into_iter().filter_map(|(id, b)| names.get(&id).map(|n| (n.clone(), b))).collect(), dir.display().to_string())
        }
        (None, None) => return Err("give --data-dir or --csv".into()),
    };
    let report = subtree::report::Report::new(&topics, a.max_stores, a.min_store_bytes);
    match a.format.as_str() {
        "json" => println!("{}", serde_json::to_string_pretty(&report.json()).expect("json")),
        _ => print!("{}", report.text()),
    }
    std::fs::write(&a.html, report.html(&format!("Split plans for {title}"))).map_err(|e| format!("{}: {e}", a.html.display()))?;
    eprintln!("wrote {}", a.html.display());
    Ok(())
}

/// glibc's malloc hands freed memory back to the kernel eagerly: blocks
/// over its (moving) mmap threshold are mapped and unmapped each time, and
/// a heap top over twice that threshold is trimmed. A broker reads each
/// request into a fresh buffer of up to a few MiB and frees it when the
/// handler is done, so memory went back and forth: up to 40,000 page
/// faults per GB produced, each a page zeroed again (and, on a VM whose
/// free memory returns to its host, faulted in by the host again). Fixed
/// thresholds keep freed memory for the next request: blocks up to 32 MiB
/// come from the heap, and up to 128 MiB of free heap top stays.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // SAFETY: mallopt(3) only sets allocator parameters, and runs here
    // before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

fn main() -> std::process::ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Serve(a)) => a,
        Some(Command::User(a)) => {
            return match set_user(a) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("canopy user: {e}");
                    std::process::ExitCode::from(2)
                }
            };
        }
        Some(Command::SplitReport(a)) => {
            return match split_report(a) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("canopy split-report: {e}");
                    std::process::ExitCode::from(2)
                }
            };
        }
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
