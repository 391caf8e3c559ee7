// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vhost-crypto-replay`: replay a virtio-crypto request trace against a
//! vhost-user backend, check every result and measure. See tools/replay/README.md.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use vhost_crypto_replay::frontend::{
    queue_size_ok, CryptoFrontend, DescMode, FrontendConfig, MAX_QUEUE_SIZE,
};
use vhost_crypto_replay::gen::{generate, GenOpcode, GenOptions};
use vhost_crypto_replay::replay::{
    compare_outcomes, replay, replay_threads, Comparison, ReplayOptions, Report,
};
use vhost_crypto_replay::soak::{soak, Layouts, SoakOptions};
use vhost_crypto_replay::spawn::SpawnedDaemon;
use vhost_crypto_replay::trace::{Step, Trace};
use vhost_user_crypto::wire::session::SessionAbi;

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
    /// Write a benchmark trace whose expected outputs come from the tool's
    /// reference cipher (RustCrypto cbc + aes).
    Gen(GenArgs),
    /// Run COUNT requests generated on the fly from a seed (mixed sizes,
    /// encrypt and decrypt, several sessions rekeyed during the run, all
    /// queues, direct and indirect layouts) and check every result.
    Soak(SoakArgs),
}

#[derive(Debug, Args)]
struct SoakArgs {
    /// PRNG seed (the same seed gives the same requests).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Number of requests (at least 1).
    #[arg(long, default_value_t = 100_000, value_parser = at_least_one::<u64>)]
    count: u64,
    /// Number of data queues.
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// Requests in flight per queue.
    #[arg(long, default_value_t = 64)]
    queue_depth: u16,
    /// Session slots kept open.
    #[arg(long, default_value_t = 8)]
    sessions: u16,
    /// Close and re-create one session every N requests (0: never).
    #[arg(long, default_value_t = 1000)]
    rekey_every: u64,
    /// About one request in N names a closed session and must get INVSESS (0: none).
    #[arg(long, default_value_t = 500)]
    stale_every: u64,
    /// Largest request in bytes (a multiple of 16; sizes are biased toward small ones).
    #[arg(long, default_value_t = 16384)]
    max_size: usize,
    /// Descriptor layouts: both per request, or one kind only.
    #[arg(long, value_enum, default_value_t = Layouts::Mixed)]
    descriptors: Layouts,
    #[command(flatten)]
    backend: BackendArgs,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
    /// Seconds to wait for a completion before failing (at least 1).
    #[arg(long, default_value_t = 10, value_parser = at_least_one::<u64>)]
    timeout: u64,
}

/// Which backend to drive, and the session payload layout.
///
/// Exactly one of --socket and --spawn-daemon is required (the `backend`
/// group), so a missing or doubled backend is reported naming both. The
/// requirement is waived when a subcommand is given instead
/// (`args_conflicts_with_subcommands` on [`Cli`]).
#[derive(Debug, Args)]
#[group(skip)]
#[command(group(ArgGroup::new("backend").args(["socket", "spawn_daemon"]).required(true).multiple(false)))]
struct BackendArgs {
    /// Backend socket to connect to.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Start the daemon on a private socket for this run, and stop it after.
    #[arg(long)]
    spawn_daemon: bool,
    /// Daemon binary for --spawn-daemon (default: vhost-user-crypto next to
    /// this binary). Only with --spawn-daemon: with --socket it would be
    /// silently unused.
    #[arg(long, conflicts_with = "socket")]
    daemon_bin: Option<PathBuf>,
    /// Session payload layout.
    #[arg(long, value_enum, default_value_t = AbiArg::C)]
    session_abi: AbiArg,
}

impl BackendArgs {
    fn abi(&self) -> SessionAbi {
        match self.session_abi {
            AbiArg::A => SessionAbi::A,
            AbiArg::B => SessionAbi::B,
            AbiArg::C => SessionAbi::C,
        }
    }

    /// The socket to connect to: --socket, or that of a daemon started
    /// now with `queues` data queues (kept alive by the returned handle).
    fn socket(&self, queues: u16) -> Result<(Option<SpawnedDaemon>, PathBuf), String> {
        if self.spawn_daemon {
            let d = SpawnedDaemon::start(self.daemon_bin.as_deref(), queues).map_err(|e| e.to_string())?;
            let s = d.socket().to_path_buf();
            Ok((Some(d), s))
        } else {
            let s = self
                .socket
                .clone()
                .ok_or("--socket or --spawn-daemon is required")?;
            Ok((None, s))
        }
    }
}

#[derive(Debug, Args)]
struct GenArgs {
    /// Request opcode.
    #[arg(long, value_enum, default_value_t = GenOpcode::Encrypt)]
    opcode: GenOpcode,
    /// Bytes per request (multiple of 16).
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Number of requests (at least 1).
    #[arg(long, default_value_t = 1000, value_parser = at_least_one::<u64>)]
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
    /// Write every request as an explicit `request` line (hex data and
    /// expected output) instead of one `generate` line per session.
    #[arg(long)]
    expanded: bool,
    /// Output file.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Trace file (JSON Lines).
    // Required, but an Option: `gen` and `soak` leave it unset.
    #[arg(required = true)]
    trace: Option<PathBuf>,
    #[command(flatten)]
    backend: BackendArgs,
    /// Number of data queues.
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// Drive each data queue from its own thread (requests dealt to the
    /// queues as without it; no raw requests, not with --dpdk-diff).
    #[arg(long, conflicts_with = "dpdk_diff")]
    queue_threads: bool,
    /// Entries per ring (power of two, 1 to 32768).
    #[arg(long, default_value_t = 1024, value_parser = parse_queue_size)]
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
    /// CREATE, layout A, indirect tables, ring slot i = head i, polling
    /// (layout A and indirect tables override --session-abi and
    /// --descriptors).
    #[arg(long)]
    dpdk: bool,
    /// Replay the trace this many times (at least 1).
    #[arg(long, default_value_t = 1, value_parser = at_least_one::<u32>)]
    repeat: u32,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
    /// Seconds to wait for a completion before failing (at least 1).
    #[arg(long, default_value_t = 10, value_parser = at_least_one::<u64>)]
    timeout: u64,
    /// Differential mode: also replay the trace against DPDK 22.11's
    /// vhost_crypto at this socket (driven as with --dpdk) and compare every
    /// request's status, dst and hash result byte for byte (used lengths
    /// are compared and reported apart: DPDK's differ on failed verifies).
    #[arg(long, value_name = "SOCKET", conflicts_with = "dpdk")]
    dpdk_diff: Option<PathBuf>,
}

/// A count or time that must be at least 1 (clap's own range check would
/// name `u64::MAX` as the upper bound in its message).
fn at_least_one<T>(s: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + From<u8>,
    T::Err: std::fmt::Display,
{
    match s.parse::<T>() {
        Ok(n) if n >= T::from(1) => Ok(n),
        Ok(_) => Err("must be at least 1".into()),
        // "invalid digit found in string", "number too large to fit in
        // target type", ...
        Err(e) => Err(e.to_string()),
    }
}

/// `--queue-size`: a power of two up to [`MAX_QUEUE_SIZE`], checked
/// before the trace is loaded (the frontend checks it again).
fn parse_queue_size(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(n) if queue_size_ok(n) => Ok(n),
        _ => Err(format!("must be a power of two from 1 to {MAX_QUEUE_SIZE}")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Some(Cmd::Gen(g)) => run_gen(g),
        Some(Cmd::Soak(s)) => run_soak(s),
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
        expanded: g.expanded,
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

fn run_soak(a: SoakArgs) -> Result<ExitCode, String> {
    let opts = SoakOptions {
        seed: a.seed,
        count: a.count,
        queue_depth: a.queue_depth,
        sessions: a.sessions,
        rekey_every: a.rekey_every,
        stale_every: a.stale_every,
        max_size: a.max_size,
        layouts: a.descriptors,
        timeout: Duration::from_secs(a.timeout),
        progress: !a.json && std::io::stderr().is_terminal(),
    };
    opts.validate()?;
    let cfg = opts.frontend_config(a.queues, a.backend.abi());
    cfg.validate().map_err(|e| e.to_string())?;
    let (_daemon, socket) = a.backend.socket(a.queues)?;
    let mut fe = CryptoFrontend::connect(&socket, &cfg).map_err(|e| e.to_string())?;
    let report = soak(&mut fe, &opts, None).map_err(|e| e.to_string())?;
    if a.json {
        println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
    } else {
        print!("{}", report.summary());
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn run_replay(a: RunArgs) -> Result<ExitCode, String> {
    let path = a.trace.ok_or("no trace file given (see --help)")?;
    let trace = Trace::load(&path).map_err(|e| e.to_string())?;
    let mut abi = a.backend.abi();
    let mut desc_mode = match a.descriptors {
        DescArg::Chain => DescMode::Chain,
        DescArg::Indirect => DescMode::Indirect,
    };
    if a.dpdk || a.dpdk_diff.is_some() {
        let flag = if a.dpdk { "--dpdk" } else { "--dpdk-diff" };
        if a.dpdk {
            abi = SessionAbi::A;
            desc_mode = DescMode::Indirect;
        }
        if trace.max_payload() > 2048 {
            return Err(format!(
                "{flag}: DPDK 22.11 never completes cipher requests over 2048 bytes; the trace has {}",
                trace.max_payload()
            ));
        }
        // DPDK is driven with indirect tables only (its vhost-crypto
        // needs head i in ring slot i).
        if let Some(r) = trace.steps.iter().find_map(|s| match s {
            Step::Raw(r) if r.indirect == Some(false) => Some(r),
            _ => None,
        }) {
            return Err(format!(
                "{flag}: DPDK is driven with indirect tables only; trace line {} is a raw direct chain",
                r.line
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
    let dpdk_cfg = FrontendConfig {
        session_abi: SessionAbi::A,
        desc_mode: DescMode::Indirect,
        dpdk: true,
        ..cfg.clone()
    };
    let (_daemon, socket) = a.backend.socket(a.queues)?;
    let mut fe = CryptoFrontend::connect(&socket, &cfg).map_err(|e| e.to_string())?;
    let opts = ReplayOptions {
        repeat: a.repeat,
        queue_depth: a.queue_depth,
        timeout: Duration::from_secs(a.timeout),
        progress: !a.json && std::io::stderr().is_terminal(),
        record: a.dpdk_diff.is_some(),
    };
    let report = if a.queue_threads {
        replay_threads(&mut fe, &trace, &opts)
    } else {
        replay(&mut fe, &trace, &opts)
    }
    .map_err(|e| e.to_string())?;
    drop(fe);
    let other = match a.dpdk_diff {
        // Nothing to compare with DPDK when our run stopped early.
        Some(other) if report.error.is_none() => Some(other),
        _ => None,
    };
    let Some(other) = other else {
        if a.json {
            println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
        } else {
            print!("{}", report.summary());
        }
        return Ok(if report.mismatches == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    };
    // Our run's report is printed with the comparison: a DPDK side that
    // cannot be reached or driven would lose it, so it is printed on its
    // own then (in JSON with `"dpdk": null` and the error), and the
    // error follows (exit 2, whatever our run's result).
    let dpdk = CryptoFrontend::connect(&other, &dpdk_cfg)
        .map_err(|e| e.to_string())
        .and_then(|mut fe| replay(&mut fe, &trace, &opts).map_err(|e| e.to_string()));
    let dpdk = match dpdk {
        Ok(d) => d,
        Err(e) => {
            let e = format!("--dpdk-diff: {e}");
            if a.json {
                println!("{}", diff_json(&report, None, Some(&e))?);
            } else {
                print!("{}", report.summary());
                println!("--- DPDK ({}): not compared: {e}", other.display());
            }
            return Err(e);
        }
    };
    let cmp = compare_outcomes(&report.outcomes, &dpdk.outcomes, 10);
    if a.json {
        println!("{}", diff_json(&report, Some((&dpdk, &cmp)), None)?);
    } else {
        print!("{}", report.summary());
        println!("--- DPDK ({}), checked against the trace:", other.display());
        print!("{}", dpdk.summary());
        println!(
            "--- compared {} requests (status, dst, hash result): {} differences; used lengths differ on {}",
            cmp.compared, cmp.differences, cmp.used_len_differences
        );
        for m in &cmp.first_differences {
            println!(
                "DIFFERENCE trace line {}: {}: ours {}, DPDK {}",
                m.line, m.field, m.expected, m.got
            );
        }
    }
    // The verdict: our results match the trace and DPDK's match ours byte
    // for byte, and DPDK's run did not stop early. DPDK's own mismatches
    // against the trace are reported (its used length on a failed verify
    // differs by convention).
    Ok(
        if report.mismatches == 0 && cmp.differences == 0 && dpdk.error.is_none() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        },
    )
}

/// `--dpdk-diff --json`'s object: our run's report with `dpdk` (DPDK's
/// report) and `comparison` added, both null when DPDK could not be
/// reached or driven, and then `dpdk_error`.
fn diff_json(
    ours: &Report,
    dpdk: Option<(&Report, &Comparison)>,
    error: Option<&str>,
) -> Result<serde_json::Value, String> {
    let json = |v: Result<serde_json::Value, serde_json::Error>| v.map_err(|e| e.to_string());
    let mut v = json(serde_json::to_value(ours))?;
    let (d, c) = match dpdk {
        Some((d, c)) => (json(serde_json::to_value(d))?, json(serde_json::to_value(c))?),
        None => (serde_json::Value::Null, serde_json::Value::Null),
    };
    v["dpdk"] = d;
    v["comparison"] = c;
    if let Some(e) = error {
        v["dpdk_error"] = e.into();
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("vhost-crypto-replay").chain(args.iter().copied()))
    }

    #[test]
    fn command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn queue_size_is_checked_by_the_parser() {
        for bad in ["0", "1000", "32769", "65535", "65536", "x"] {
            let e = parse(&["--spawn-daemon", "--queue-size", bad, "t.jsonl"]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{bad}");
            assert!(
                e.to_string().contains("must be a power of two from 1 to 32768"),
                "{e}"
            );
        }
        for good in ["1", "256", "32768"] {
            let cli = parse(&["--spawn-daemon", "--queue-size", good, "t.jsonl"]).unwrap();
            assert_eq!(cli.run.queue_size.to_string(), good);
        }
    }

    #[test]
    fn replay_needs_a_trace_and_exactly_one_backend() {
        let cli = parse(&["--spawn-daemon", "t.jsonl"]).unwrap();
        assert!(cli.cmd.is_none() && cli.run.backend.spawn_daemon);
        assert_eq!(cli.run.trace.as_deref(), Some(std::path::Path::new("t.jsonl")));
        let cli = parse(&[
            "--socket",
            "s",
            "--dpdk",
            "--json",
            "--queue-depth",
            "8",
            "t.jsonl",
        ])
        .unwrap();
        assert_eq!(cli.run.backend.socket.as_deref(), Some(std::path::Path::new("s")));
        assert!(parse(&["--spawn-daemon", "--dpdk-diff", "d", "t.jsonl"]).is_ok());

        // A missing backend names both alternatives.
        let e = parse(&["t.jsonl"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        let msg = e.to_string();
        assert!(
            msg.contains("--socket") && msg.contains("--spawn-daemon"),
            "{msg}"
        );
        assert_eq!(
            parse(&["--spawn-daemon"]).unwrap_err().kind(),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(parse(&[]).unwrap_err().kind(), ErrorKind::MissingRequiredArgument);
        assert_eq!(
            parse(&["--socket", "s", "--spawn-daemon", "t.jsonl"])
                .unwrap_err()
                .kind(),
            ErrorKind::ArgumentConflict
        );
        // --daemon-bin names the binary --spawn-daemon starts; with --socket
        // nothing would start it.
        assert!(parse(&["--spawn-daemon", "--daemon-bin", "d", "t.jsonl"]).is_ok());
        let e = parse(&["--socket", "s", "--daemon-bin", "d", "t.jsonl"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict);
        assert!(e.to_string().contains("--daemon-bin"), "{e}");
    }

    #[test]
    fn counts_repeats_and_timeouts_of_zero_are_usage_errors() {
        for args in [
            &["gen", "--count", "0", "--out", "f"][..],
            &["soak", "--spawn-daemon", "--count", "0"],
            &["soak", "--spawn-daemon", "--timeout", "0"],
            &["--spawn-daemon", "--repeat", "0", "t.jsonl"],
            &["--spawn-daemon", "--timeout", "0", "t.jsonl"],
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{args:?}");
            assert!(e.to_string().contains("must be at least 1"), "{e}");
        }
        let e = parse(&["--spawn-daemon", "--repeat", "x", "t.jsonl"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
        assert!(e.to_string().contains("invalid digit"), "{e}");
        assert!(parse(&["--spawn-daemon", "--repeat", "1", "--timeout", "1", "t.jsonl"]).is_ok());
    }

    #[test]
    fn subcommands_do_not_need_the_replay_arguments() {
        let cli = parse(&[
            "gen", "--opcode", "encrypt", "--size", "256", "--count", "3", "--out", "f",
        ])
        .unwrap();
        assert!(matches!(cli.cmd, Some(Cmd::Gen(_))));
        let Some(Cmd::Soak(s)) = parse(&["soak", "--spawn-daemon", "--count", "5"]).unwrap().cmd else {
            panic!("not soak");
        };
        assert!(s.backend.spawn_daemon && s.backend.socket.is_none());
        assert!(parse(&["soak", "--socket", "s"]).is_ok());
        let e = parse(&["soak"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        assert!(e.to_string().contains("--spawn-daemon"));
        assert_eq!(
            parse(&["soak", "--socket", "s", "--spawn-daemon"])
                .unwrap_err()
                .kind(),
            ErrorKind::ArgumentConflict
        );
    }
}
