//! `xdp-routerd`: the XDP fast path for Linux software routers.

use std::{
    io::{IsTerminal as _, Write as _},
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::bail;
use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};
use xdp_routerd::{
    config::{Config, DEFAULT_CONTROL_SOCKET},
    control::{self, Request},
    daemon, metrics, signals,
    status::{AddrFilter, FlowFilter, Flows, Status, render_stats},
};

mod man_pages;

#[derive(Parser)]
#[command(
    version,
    about = "XDP fast path for established flows on Linux software routers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Attach to the configured interfaces and run in the foreground until SIGINT/SIGTERM.
    Run {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
        /// Control socket path (overrides `control_socket` from the config).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Show interfaces, fast path state, flow counts and per-reason counters.
    Status {
        #[command(flatten)]
        target: Target,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Switch the fast path on or off, live (nothing is detached).
    Fastpath {
        state: OnOff,
        #[command(flatten)]
        target: Target,
    },
    /// Set how long a kernel verdict holds for an offloaded flow, live (`verdict_max_age_ms`
    /// of the config until the daemon restarts; 0 = until the ruleset changes).
    VerdictAge {
        /// Milliseconds (0..=60000).
        ms: u64,
        #[command(flatten)]
        target: Target,
    },
    /// List the offloaded flows.
    Flows {
        #[command(flatten)]
        target: Target,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Only flows with this address or prefix at either end, before or after NAT
        /// (e.g. 192.0.2.7, 10.0.0.0/8, 2001:db8::/32).
        #[arg(long, value_name = "ADDR[/LEN]", value_parser = parse_addr_filter)]
        addr: Option<AddrFilter>,
        /// Only flows with this port at either end, before or after NAT.
        #[arg(long)]
        port: Option<u16>,
    },
    /// Per-interface counters of the fast path and of every reason a packet went to the kernel
    /// (like `nstat` for the fast path).
    Stats {
        #[command(flatten)]
        target: Target,
        /// Print JSON instead of a table (one object per sample in watch mode).
        #[arg(long)]
        json: bool,
        /// Refresh every SECS seconds (default 1) and show deltas and rates; Ctrl-C stops.
        #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1")]
        watch: Option<f64>,
        /// With --watch: stop after this many refreshes.
        #[arg(long, requires = "watch", value_name = "N")]
        count: Option<u64>,
        /// Also show reasons whose counters are zero.
        #[arg(long, short)]
        zeros: bool,
    },
    /// Validate a configuration file and explain what is wrong.
    CheckConfig {
        /// Configuration file (TOML).
        file: PathBuf,
    },
    /// Check this kernel and its network devices for the fast path (BTF, version, privileges,
    /// the eBPF object loading, conntrack, each device's XDP support), in lines to paste into
    /// a bug report. Exits 1 when something required is missing.
    CheckSystem {
        /// Only the interfaces of this configuration file (default: every device).
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Write the manual pages (section 8, one per command) into DIR (`cargo xtask dist`).
    #[command(hide = true)]
    ManPages {
        /// An existing directory.
        dir: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum OnOff {
    On,
    Off,
}

/// Which daemon a control command talks to.
#[derive(clap::Args)]
struct Target {
    /// Control socket of the running daemon.
    #[arg(long, conflicts_with = "config")]
    socket: Option<PathBuf>,
    /// Take the control socket path from this config file.
    #[arg(long, short)]
    config: Option<PathBuf>,
}

impl Target {
    fn socket(&self) -> anyhow::Result<PathBuf> {
        if let Some(s) = &self.socket {
            return Ok(s.clone());
        }
        if let Some(c) = &self.config {
            return Ok(Config::load(c)?.control_socket);
        }
        Ok(PathBuf::from(DEFAULT_CONTROL_SOCKET))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xdp-routerd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Every thread allocates from one malloc arena. glibc gives threads that allocate at the
/// same time arenas of their own, and each keeps pages of what it freed: with the start-up's
/// dump parsed on a runtime worker while the main thread writes the maps, that was ≈ 9 MiB
/// more RSS for good at a million connections (89.5 against 98–105 MiB in `bench scale`, the
/// start-up no slower). The daemon's threads allocate little at once otherwise.
fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a malloc parameter; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn parse_addr_filter(s: &str) -> Result<AddrFilter, String> {
    s.parse()
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run { config, socket } => {
            // SIGINT/SIGTERM are taken by a thread of their own (see `signals`): blocked here,
            // before any other thread exists, so that every thread inherits the mask.
            signals::block()?;
            one_malloc_arena();
            let config = Config::load(&config)?;
            init_logging(&config.log_level);
            let shutdown = signals::spawn_waiter()?;
            let socket = socket.unwrap_or_else(|| config.control_socket.clone());
            // Bound before anything is attached: a taken port is a start-up error.
            let metrics_listener = config.metrics_listen.map(metrics::bind).transpose()?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            let result = rt.block_on(daemon::run(config, socket, metrics_listener, shutdown));
            // The daemon has detached by now; do not let a stuck scrape or control request
            // delay the exit (SIGTERM must end the process within 2 s).
            rt.shutdown_timeout(Duration::from_millis(300));
            if result.is_ok() {
                tracing::info!("xdp-routerd stopped; the kernel forwards everything");
            }
            result
        }
        Command::Status { target, json } => {
            let v = control::call(&target.socket()?, &Request::Status)?;
            if json {
                println!("{v}");
            } else {
                let s: Status = serde_json::from_value(v)?;
                print!("{}", s.render());
            }
            Ok(())
        }
        Command::Fastpath { state, target } => {
            let on = matches!(state, OnOff::On);
            control::call(&target.socket()?, &Request::Fastpath { on })?;
            println!("fast path {}", if on { "on" } else { "off" });
            Ok(())
        }
        Command::VerdictAge { ms, target } => {
            control::call(&target.socket()?, &Request::VerdictAge { ms })?;
            println!("kernel verdicts held for {ms} ms");
            Ok(())
        }
        Command::Flows {
            target,
            json,
            addr,
            port,
        } => {
            let v = control::call(&target.socket()?, &Request::Flows)?;
            let f: Flows = serde_json::from_value(v)?;
            let f = f.filtered(&FlowFilter { addr, port });
            if json {
                println!("{}", serde_json::to_string(&f)?);
            } else {
                print!("{}", f.render());
            }
            Ok(())
        }
        Command::Stats {
            target,
            json,
            watch,
            count,
            zeros,
        } => stats(&target.socket()?, json, watch, count, zeros),
        Command::CheckSystem { config } => {
            let config = config.map(|f| Config::load(&f)).transpose()?;
            let facts = xdp_routerd::check_system::gather(config.as_ref());
            let (text, worst) =
                xdp_routerd::check_system::judge::render(env!("CARGO_PKG_VERSION"), &facts);
            print!("{text}");
            if worst == xdp_routerd::check_system::judge::Level::Fail {
                bail!("this system cannot run the fast path: see the FAIL lines above");
            }
            Ok(())
        }
        Command::ManPages { dir } => {
            for page in man_pages::write(Cli::command(), &dir)? {
                println!("{}", page.display());
            }
            Ok(())
        }
        Command::CheckConfig { file } => {
            let c = Config::load(&file)?;
            for name in c.missing_interfaces() {
                eprintln!(
                    "{}: warning: interface {name} does not exist on this host (`run` waits for it)",
                    file.display()
                );
            }
            println!(
                "{}: ok ({} interfaces: {}; metrics: {})",
                file.display(),
                c.interfaces.len(),
                c.interfaces
                    .iter()
                    .map(|i| format!("{}={}", i.name, i.role))
                    .collect::<Vec<_>>()
                    .join(", "),
                c.metrics_listen
                    .map(|a| format!("http://{a}/metrics"))
                    .unwrap_or_else(|| "disabled".into())
            );
            Ok(())
        }
    }
}

fn status_of(socket: &PathBuf) -> anyhow::Result<Status> {
    Ok(serde_json::from_value(control::call(
        socket,
        &Request::Status,
    )?)?)
}

/// `xdp-routerd stats`: one table, or with `watch` a refreshed one with deltas and rates.
fn stats(
    socket: &PathBuf,
    json: bool,
    watch: Option<f64>,
    count: Option<u64>,
    zeros: bool,
) -> anyhow::Result<()> {
    let mut prev = status_of(socket)?;
    let mut at = Instant::now();
    let Some(secs) = watch else {
        let rows = prev.stats_rows(None);
        if json {
            println!("{}", serde_json::to_string(&rows)?);
        } else {
            print!("{}", render_stats(&rows, zeros));
        }
        return Ok(());
    };
    if !(secs.is_finite() && (0.1..=3600.0).contains(&secs)) {
        bail!("--watch {secs}: the interval must be between 0.1 and 3600 seconds");
    }
    let tty = std::io::stdout().is_terminal() && !json;
    let mut shown = 0u64;
    while count.is_none_or(|c| shown < c) {
        std::thread::sleep(Duration::from_secs_f64(secs));
        let now = status_of(socket)?;
        let elapsed = at.elapsed().as_secs_f64();
        at = Instant::now();
        let rows = now.stats_rows(Some((&prev, elapsed)));
        let mut out = std::io::stdout().lock();
        if json {
            writeln!(
                out,
                "{}",
                serde_json::json!({ "interval_seconds": elapsed, "rows": rows })
            )?;
        } else {
            if tty {
                // Clear the screen and go home, like watch(1).
                write!(out, "\x1b[H\x1b[2J")?;
            } else if shown > 0 {
                writeln!(out)?;
            }
            writeln!(
                out,
                "every {secs}s (rates over the last {elapsed:.2}s; fast path {}){}",
                if now.fastpath { "on" } else { "off" },
                if tty { ", Ctrl-C to stop" } else { "" }
            )?;
            write!(out, "{}", render_stats(&rows, zeros))?;
        }
        out.flush()?;
        prev = now;
        shown += 1;
    }
    Ok(())
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // No colour codes when stderr is a file or the journal.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}
