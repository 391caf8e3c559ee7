// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vhost-crypto-replay`: replay a virtio-crypto request trace against a
//! vhost-user backend, check every result and measure. See tools/README.md.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use vhost_crypto_replay::frontend::{CryptoFrontend, DescMode, FrontendConfig};
use vhost_crypto_replay::gen::{generate, GenOpcode, GenOptions};
use vhost_crypto_replay::replay::{replay, ReplayOptions};
use vhost_crypto_replay::spawn::SpawnedDaemon;
use vhost_crypto_replay::trace::Trace;
use vhost_user_crypto::session_msg::SessionAbi;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum AbiArg {
    A,
    B,
    C,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DescArg {
    Chain,
    Indirect,
}

/// Replay a virtio-crypto request trace (JSON Lines) against a vhost-user
/// crypto backend, verify every result, and report throughput and latency.
#[derive(Debug, Parser)]
#[command(name = "vhost-crypto-replay", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Write a benchmark trace whose expected outputs come from the
    /// algorithms crate's single-stream reference path.
    Gen(GenArgs),
}

#[derive(Debug, Args)]
struct GenArgs {
    /// Request opcode.
    #[arg(long, value_enum, default_value_t = GenOpcode::Encrypt)]
    opcode: GenOpcode,
    /// Bytes per request (multiple of 16).
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Number of requests.
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// Number of keys (each gets an encrypt and a decrypt session).
    #[arg(long, default_value_t = 1)]
    sessions: u32,
    /// Key size in bits (128, 192 or 256).
    #[arg(long, default_value_t = 128)]
    key_bits: u32,
    /// PRNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output file.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Trace file (JSON Lines).
    trace: Option<PathBuf>,
    /// Backend socket to connect to.
    #[arg(long, required_unless_present = "spawn_daemon")]
    socket: Option<PathBuf>,
    /// Start the daemon on a private socket, replay, and stop it.
    #[arg(long, conflicts_with = "socket")]
    spawn_daemon: bool,
    /// Daemon binary for --spawn-daemon (default: vhost-user-crypto next to this binary).
    #[arg(long)]
    daemon_bin: Option<PathBuf>,
    /// Session payload layout.
    #[arg(long, value_enum, default_value_t = AbiArg::C)]
    session_abi: AbiArg,
    /// Number of data queues.
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// Entries per ring (power of two).
    #[arg(long, default_value_t = 1024)]
    queue_size: u16,
    /// Requests in flight per queue.
    #[arg(long, default_value_t = 128)]
    queue_depth: u16,
    /// Descriptor layout of each request.
    #[arg(long, value_enum, default_value_t = DescArg::Indirect)]
    descriptors: DescArg,
    /// Guest memory in MiB (default: sized to the queues and the largest request).
    #[arg(long)]
    memory_mib: Option<usize>,
    /// Drive DPDK 22.11's vhost-crypto: rings enabled before the first
    /// CREATE, layout A, indirect tables, ring slot i = head i, polling.
    #[arg(long)]
    dpdk: bool,
    /// Replay the trace this many times.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
    /// Seconds to wait for a completion before failing.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Some(Cmd::Gen(g)) => run_gen(g),
        None => run_replay(cli.run),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vhost-crypto-replay: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_gen(g: GenArgs) -> Result<ExitCode, String> {
    let opts = GenOptions {
        opcode: g.opcode,
        size: g.size,
        count: g.count,
        sessions: g.sessions,
        key_bits: g.key_bits,
        seed: g.seed,
    };
    // Check the options before touching an existing --out file.
    generate(
        &GenOptions {
            count: 0,
            ..opts.clone()
        },
        &mut std::io::sink(),
    )
    .map_err(|e| e.to_string())?;
    let file =
        std::fs::File::create(&g.out).map_err(|e| format!("cannot create {}: {e}", g.out.display()))?;
    let mut w = std::io::BufWriter::new(file);
    generate(&opts, &mut w).map_err(|e| format!("writing {}: {e}", g.out.display()))?;
    Ok(ExitCode::SUCCESS)
}

fn run_replay(a: RunArgs) -> Result<ExitCode, String> {
    let path = a.trace.ok_or("no trace file given (see --help)")?;
    let trace = Trace::load(&path).map_err(|e| e.to_string())?;
    let mut abi = match a.session_abi {
        AbiArg::A => SessionAbi::A,
        AbiArg::B => SessionAbi::B,
        AbiArg::C => SessionAbi::C,
    };
    let mut desc_mode = match a.descriptors {
        DescArg::Chain => DescMode::Chain,
        DescArg::Indirect => DescMode::Indirect,
    };
    if a.dpdk {
        abi = SessionAbi::A;
        desc_mode = DescMode::Indirect;
        if trace.max_payload() > 2048 {
            return Err(format!(
                "--dpdk: DPDK 22.11 never completes cipher requests over 2048 bytes; the trace has {}",
                trace.max_payload()
            ));
        }
    }
    let cfg = FrontendConfig {
        queues: a.queues,
        queue_size: a.queue_size,
        queue_depth: a.queue_depth,
        max_payload: trace.max_payload().max(16),
        max_iv: trace.max_iv().max(16),
        memory_bytes: a.memory_mib.unwrap_or(0) << 20,
        session_abi: abi,
        desc_mode,
        dpdk: a.dpdk,
    };
    cfg.validate().map_err(|e| e.to_string())?;
    let _daemon;
    let socket = if a.spawn_daemon {
        let d = SpawnedDaemon::start(a.daemon_bin.as_deref(), a.queues).map_err(|e| e.to_string())?;
        let s = d.socket().to_path_buf();
        _daemon = d;
        s
    } else {
        a.socket.ok_or("--socket or --spawn-daemon is required")?
    };
    let mut fe = CryptoFrontend::connect(&socket, &cfg).map_err(|e| e.to_string())?;
    let opts = ReplayOptions {
        repeat: a.repeat,
        queue_depth: a.queue_depth,
        timeout: Duration::from_secs(a.timeout),
        progress: !a.json && std::io::stderr().is_terminal(),
    };
    let report = replay(&mut fe, &trace, &opts).map_err(|e| e.to_string())?;
    if a.json {
        println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
    } else {
        print!("{}", report.summary());
    }
    Ok(if report.mismatches == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
