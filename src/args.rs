// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Command-line arguments of the `vhost-user-crypto` daemon.

use std::ffi::OsString;
use std::num::NonZeroU64;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{ArgGroup, Parser, ValueEnum};

use crate::crypto::RequestLimits;
use crate::daemon::{Config, Listen};
use crate::proxy::AbiChoice;
use crate::throttle::{RateLimits, Throttle};
use crate::wire::session::SessionAbi;

/// Layout of the CREATE_CRYPTO_SESSION payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SessionAbiArg {
    /// Detect from size and content.
    Auto,
    /// 632 bytes with op_code (QEMU ≤ 7.0, DPDK ≤ 24.11).
    A,
    /// 632 bytes without op_code (QEMU 7.1–8.0, e.g. Debian 12's 7.2).
    B,
    /// 1072 bytes (QEMU ≥ 8.1, DPDK ≥ 25.03).
    C,
}

/// What `--print-capabilities` prints: the backend type `crypto` of QEMU's
/// vhost-user backend schema (`docs/interop/vhost-user.json`).
pub const CAPABILITIES: &str = r#"{"type": "crypto"}"#;

/// Whether `--print-capabilities` is among the arguments (the program
/// name first; none after a `--`). QEMU's "Backend program conventions"
/// (`docs/interop/vhost-user.rst`) have it print the capabilities and
/// exit successfully, whatever else is given.
pub fn wants_capabilities<I: IntoIterator<Item = OsString>>(args: I) -> bool {
    args.into_iter()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--print-capabilities")
}

/// Whether the queue workers run under the seccomp allow-list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SeccompArg {
    /// Install the allow-list on every queue worker (see docs/RELIABILITY.md).
    On,
    /// No syscall filtering.
    Off,
}

/// vhost-user backend for the virtio-crypto device (AES-CBC, and AES-CBC
/// chained with HMAC-SHA1 / HMAC-SHA-256).
///
/// Serves one frontend (QEMU's `-object cryptodev-vhost-user`) at a time on
/// a Unix socket (--socket-path, or one inherited with --fd), and accepts
/// the next one with fresh state after a disconnect. SIGTERM and SIGINT
/// end it with status 0. Logging is controlled with RUST_LOG (default:
/// info).
#[derive(Debug, Parser)]
#[command(name = "vhost-user-crypto", version, after_long_help = AFTER_LONG_HELP)]
#[command(group(ArgGroup::new("listen").required(true).args(["socket_path", "fd"])))]
pub struct Args {
    /// Unix socket to listen on; a stale socket file is replaced, one in
    /// use is refused, and the file is removed on SIGTERM and SIGINT.
    #[arg(long, value_name = "PATH")]
    pub socket_path: Option<PathBuf>,

    /// Serve the Unix stream socket inherited as descriptor N instead of
    /// --socket-path: a listening socket (systemd's socket activation)
    /// serves one frontend after another, a connected one serves that
    /// frontend, then the daemon exits 0.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(RawFd).range(0..))]
    pub fd: Option<RawFd>,

    /// Print the backend's capabilities as JSON (`{"type": "crypto"}`) and
    /// exit 0, ignoring every other option (QEMU's vhost-user backend
    /// program conventions).
    #[arg(long)]
    pub print_capabilities: bool,

    /// Number of data queues, 1 to 64. QEMU serves only queue 0 with
    /// vhost-user, so keep 1 for it; other frontends (the replay tool) use
    /// more.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub queues: u16,

    /// Most sessions live at once on a connection; past it CREATE gets a negative id.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_sessions: u32,

    /// Largest cipher request (src_data_len) in bytes, 16 to 1 GiB; larger
    /// requests complete with ERR. (The bound keeps every used length, up
    /// to src + digest + status, within the used element's 32 bits.)
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u32).range(16..=1 << 30))]
    pub max_request_bytes: u32,

    /// Layout of CREATE_CRYPTO_SESSION payloads.
    #[arg(long, value_enum, default_value_t = SessionAbiArg::Auto)]
    pub session_abi: SessionAbiArg,

    /// Microseconds a queue worker keeps polling the avail ring after its
    /// last request before sleeping on kicks again, 0 to 1,000,000 (0: not
    /// after the last request; while requests come, the worker takes them
    /// without kicks).
    #[arg(long, default_value_t = DEFAULT_POLL_US, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub poll_us: u64,

    /// seccomp allow-list on the queue worker threads; a syscall outside it
    /// kills the daemon (docs/RELIABILITY.md, "Least privilege").
    #[arg(long, value_enum, default_value_t = SeccompArg::On)]
    pub seccomp: SeccompArg,

    /// Refuse guest memory whose file cannot be sealed against shrinking
    /// (F_SEAL_SHRINK): only memfds made with MFD_ALLOW_SEALING, or already
    /// sealed, are accepted. Without it such regions are accepted with a
    /// warning (a frontend truncating them would crash the daemon).
    #[arg(long)]
    pub require_sealed_memory: bool,

    /// Unix socket (mode 0600) on which each connection gets the daemon's
    /// counters as one JSON object, then EOF (docs/OPERATING.md); a stale
    /// socket file is replaced, one in use is refused.
    #[arg(long, value_name = "PATH")]
    pub stats_socket: Option<PathBuf>,
    /// Most requests per second, all queues together (as QEMU's
    /// cryptodev `throttle-ops`); a queue over it takes no requests from
    /// its avail ring until tokens return. Burst: 100 ms worth. At least
    /// 1; no limit by default.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_ops_per_sec: Option<u64>,

    /// Most bytes (src_data_len) per second, all queues together (as
    /// QEMU's cryptodev `throttle-bps`). Burst: 100 ms worth. At least 1;
    /// no limit by default.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_bytes_per_sec: Option<u64>,
}

/// The end of `--help` (and the man page's description): the engine
/// variables and the exit statuses.
pub const AFTER_LONG_HELP: &str = "\
Environment:
  RUST_LOG                      log level (default info)
  VHOST_USER_CRYPTO_AES_ENGINE  soft, aesni, vaes256 or vaes512 (default: the fastest the CPU runs)
  VHOST_USER_CRYPTO_SHA_ENGINE  portable, shani, shani-x2, shani-x4 or avx512-x16 (default: the fastest)

Exit status:
  0  SIGTERM or SIGINT; the end of a connected --fd socket's frontend
  1  a socket or start-up failure (one line starting 'vhost-user-crypto: ')
  2  bad arguments
  3  a departed frontend's connection could not be torn down (for a supervisor to restart the daemon)";

/// Default of `--poll-us`.
pub const DEFAULT_POLL_US: u64 = 50;

/// The process-wide throttle of `--max-ops-per-sec` and
/// `--max-bytes-per-sec`, if either is given.
fn throttle(ops: Option<u64>, bytes: Option<u64>, queues: usize) -> Option<Arc<Throttle>> {
    let limits = RateLimits {
        ops_per_sec: ops.and_then(NonZeroU64::new),
        bytes_per_sec: bytes.and_then(NonZeroU64::new),
    };
    limits.any().then(|| Arc::new(Throttle::new(limits, queues)))
}

impl From<Args> for Config {
    fn from(a: Args) -> Self {
        Config {
            // (The "listen" group requires exactly one of the two.)
            listen: match a.fd {
                Some(fd) => Listen::Fd(fd),
                None => Listen::Path(a.socket_path.unwrap_or_default()),
            },
            queues: usize::from(a.queues),
            max_sessions: a.max_sessions as usize,
            limits: RequestLimits {
                max_request_bytes: a.max_request_bytes,
            },
            poll: std::time::Duration::from_micros(a.poll_us),
            session_abi: match a.session_abi {
                SessionAbiArg::Auto => AbiChoice::Auto,
                SessionAbiArg::A => AbiChoice::Fixed(SessionAbi::A),
                SessionAbiArg::B => AbiChoice::Fixed(SessionAbi::B),
                SessionAbiArg::C => AbiChoice::Fixed(SessionAbi::C),
            },
            seccomp: a.seccomp == SeccompArg::On,
            require_sealed_memory: a.require_sealed_memory,
            stats_socket: a.stats_socket,
            throttle: throttle(a.max_ops_per_sec, a.max_bytes_per_sec, usize::from(a.queues)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c: Config = Args::parse_from(["x", "--socket-path", "/tmp/s"]).into();
        assert_eq!(c.queues, 1);
        assert_eq!(c.max_sessions, 1024);
        assert_eq!(c.limits.max_request_bytes, 1 << 20);
        assert_eq!(c.session_abi, AbiChoice::Auto);
        assert!(c.seccomp, "seccomp is on by default");
        assert!(!c.require_sealed_memory);
        assert_eq!(c.stats_socket, None);
        let c: Config = Args::parse_from(["x", "--socket-path", "/s", "--stats-socket", "/t"]).into();
        assert_eq!(c.stats_socket, Some(PathBuf::from("/t")));
        assert!(c.throttle.is_none(), "no rate limit by default");
    }

    #[test]
    fn rate_limits() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["x", "--socket-path", "/s", "--queues", "2"];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv).map(Config::from)
        };
        let c = parse(&["--max-ops-per-sec", "5000"]).unwrap();
        let t = c.throttle.expect("a throttle");
        assert_eq!(t.limits().ops_per_sec, NonZeroU64::new(5000));
        assert_eq!(t.limits().bytes_per_sec, None);
        // 5000/s × 25 ms over 2 queues.
        assert_eq!(t.batch_caps(), (62, u64::MAX));
        let c = parse(&["--max-bytes-per-sec", "1280000", "--max-ops-per-sec", "7"]).unwrap();
        let t = c.throttle.expect("a throttle");
        assert_eq!(t.limits().bytes_per_sec, NonZeroU64::new(1_280_000));
        assert_eq!(t.limits().ops_per_sec, NonZeroU64::new(7));
        for bad in [
            &["--max-ops-per-sec", "0"][..],
            &["--max-bytes-per-sec", "0"],
            &["--max-ops-per-sec", "-1"],
            &["--max-bytes-per-sec", "1k"],
            &["--max-ops-per-sec"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn seccomp_and_sealed_memory_flags() {
        let parse = |extra: &[&str]| -> Config {
            let mut argv = vec!["x", "--socket-path", "/s"];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv).unwrap().into()
        };
        assert!(parse(&["--seccomp", "on"]).seccomp);
        assert!(!parse(&["--seccomp", "off"]).seccomp);
        assert!(parse(&["--require-sealed-memory"]).require_sealed_memory);
        for bad in [
            &["--seccomp"][..],
            &["--seccomp", "log"],
            &["--require-sealed-memory=yes"],
        ] {
            let mut argv = vec!["x", "--socket-path", "/s"];
            argv.extend_from_slice(bad);
            assert!(Args::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn overrides_and_bad_values() {
        let c: Config = Args::parse_from([
            "x",
            "--socket-path",
            "/s",
            "--queues",
            "4",
            "--max-sessions",
            "8",
            "--max-request-bytes",
            "4096",
            "--session-abi",
            "b",
        ])
        .into();
        assert_eq!((c.queues, c.max_sessions), (4, 8));
        assert_eq!(c.session_abi, AbiChoice::Fixed(SessionAbi::B));
        assert!(Args::try_parse_from(["x", "--socket-path", "/s", "--queues", "0"]).is_err());
        for bad in ["15", "1073741825", "4294967295"] {
            assert!(
                Args::try_parse_from(["x", "--socket-path", "/s", "--max-request-bytes", bad]).is_err(),
                "--max-request-bytes {bad}"
            );
        }
        let c: Config =
            Args::try_parse_from(["x", "--socket-path", "/s", "--max-request-bytes", "1073741824"])
                .unwrap()
                .into();
        assert_eq!(c.limits.max_request_bytes, 1 << 30);
        assert!(Args::try_parse_from(["x", "--socket-path", "/s", "--session-abi", "d"]).is_err());
        assert!(Args::try_parse_from(["x"]).is_err());
    }

    #[test]
    fn fd_and_socket_path_are_exclusive_and_one_is_required() {
        let c: Config = Args::try_parse_from(["x", "--fd", "3"]).unwrap().into();
        assert_eq!(c.listen, Listen::Fd(3));
        let c: Config = Args::try_parse_from(["x", "--socket-path", "/s"]).unwrap().into();
        assert_eq!(c.listen, Listen::Path("/s".into()));
        for bad in [
            &["--fd", "3", "--socket-path", "/s"][..],
            &["--fd", "-1"],
            &["--fd", "x"],
            &["--fd"],
            &["--queues", "2"],
        ] {
            let mut argv = vec!["x"];
            argv.extend_from_slice(bad);
            assert!(Args::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }
}
