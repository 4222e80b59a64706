//! `xdp-routerd`: the XDP fast path for Linux software routers.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand, ValueEnum};
use xdp_routerd::{
    config::{Config, DEFAULT_CONTROL_SOCKET},
    control::{self, Request},
    daemon,
    status::{Flows, Status},
};

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
    /// List the offloaded flows.
    Flows {
        #[command(flatten)]
        target: Target,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Validate a configuration file and explain what is wrong.
    CheckConfig {
        /// Configuration file (TOML).
        file: PathBuf,
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

fn real_main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run { config, socket } => {
            let config = Config::load(&config)?;
            init_logging(&config.log_level);
            let socket = socket.unwrap_or_else(|| config.control_socket.clone());
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(daemon::run(config, socket))
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
        Command::Flows { target, json } => {
            let v = control::call(&target.socket()?, &Request::Flows)?;
            if json {
                println!("{v}");
            } else {
                let f: Flows = serde_json::from_value(v)?;
                print!("{}", f.render());
            }
            Ok(())
        }
        Command::CheckConfig { file } => {
            let c = Config::load(&file)?;
            println!(
                "{}: ok ({} interfaces: {})",
                file.display(),
                c.interfaces.len(),
                c.interfaces
                    .iter()
                    .map(|i| format!("{}={}", i.name, i.role))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            Ok(())
        }
    }
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
